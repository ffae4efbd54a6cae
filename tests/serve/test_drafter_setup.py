"""agspec.serve.drafter_setup: the cost profile, drafter and live profile the engine is
built with (no model: the shipped H200 profile and a character tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartok import CharTokenizer

from agspec.drafter import AgSpecServer
from agspec.serve.cost_online import LiveCostProfile
from agspec.serve.drafter_setup import make_drafter, resolve_cost_profile, start_live_cost
from agspec.serve.engine import EngineConfig

PROFILE = Path(__file__).parents[2] / "src/agspec/data/costmodels/h200-qwen2.5-7b-ctx4096.json"


def test_a_given_profile_is_used_as_is_and_a_missing_one_refused(tmp_path: Path) -> None:
    said: list[str] = []
    got = resolve_cost_profile(EngineConfig(cost_profile=str(PROFILE)), tmp_path, said.append)
    assert got == PROFILE and said == []  # nothing measured, nothing said
    with pytest.raises(ValueError, match=r"--cost-profile .*nope.json: no such file"):
        resolve_cost_profile(EngineConfig(cost_profile=str(tmp_path / "nope.json")), tmp_path,
                             said.append)  # fmt: skip


def test_drafters_by_name(tmp_path: Path) -> None:
    kw = {"tokenizer": CharTokenizer(), "model_name": "m", "cost_profile_path": PROFILE}
    assert make_drafter(EngineConfig(drafter="none"), **kw) is None
    state = tmp_path / "state"
    cfg = EngineConfig(drafter="agspec", state_dir=str(state), session_ttl_s=7.0)
    server = make_drafter(cfg, **kw)
    assert isinstance(server, AgSpecServer) and state.is_dir()
    assert server.lengths.batch_size == 1 and server.config.session_ttl_s == 7.0
    with pytest.raises(ValueError, match=r"unknown drafter 'nope'; known: agspec, none, ar"):
        make_drafter(EngineConfig(drafter="nope"), **kw)


def test_the_live_profile_starts_from_the_file() -> None:
    said: list[str] = []
    live = start_live_cost(PROFILE, said.append)
    assert isinstance(live, LiveCostProfile) and live.num_samples == 0
    assert len(said) == 1 and "corrected online" in said[0]
