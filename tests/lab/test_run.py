"""A whole run folder on hand-built sessions: split, outputs, report, plots, CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agspec.lab.oracle import OracleServer
from agspec.lab.records import ReplayCall, ReplaySession, read_steps
from agspec.lab.registry import DRAFTERS, make_server, register_drafter
from agspec.lab.report import format_agent_table, format_table, load_entries
from agspec.lab.run import RunConfig, fold_of, global_docs_by_fold, make_servers, run_replay


class Flat:
    def step_cost(self, n_tokens, batch_size):
        return 1.0


def _sessions() -> list[ReplaySession]:
    # Fold of "a" and "b" is 0, of "e" and "f" is 1 (see fold_of's doctest).
    def call(agent, turn, prompt, out):
        return ReplayCall(agent, "code", turn, list(prompt), list(out))

    return [
        ReplaySession("a", (call("coder", 0, [1, 2, 3], [4, 5, 6, 7]),), source="src1"),
        ReplaySession("e", (call("coder", 0, [9], [4, 5, 6, 7, 8]),), source="src1"),
        ReplaySession("b", (call("tester", 0, [1], [2, 2, 2]),), source="src2"),
        ReplaySession("f", (call("tester", 1, [3], [2, 2, 2]),), source="src2"),
    ]


def test_global_split_never_holds_the_replayed_session() -> None:
    sessions = _sessions()
    assert [fold_of(s.session_id) for s in sessions] == [0, 1, 0, 1]
    docs = global_docs_by_fold(sessions, include_prompts=False)
    assert docs[0] == [[4, 5, 6, 7, 8], [2, 2, 2]]  # fold 0 sees fold 1's outputs
    assert docs[1] == [[4, 5, 6, 7], [2, 2, 2]]
    with_prompts = global_docs_by_fold(sessions, include_prompts=True)
    assert with_prompts[0] == [[9], [4, 5, 6, 7, 8], [3], [2, 2, 2]]


def test_make_servers_builds_one_server_per_fold() -> None:
    sessions = _sessions()[:2]
    config = RunConfig(drafters=("oracle",), batch_sizes=(1,))
    servers = make_servers(
        "oracle", sessions, config, tokenizer=None, cost_model=Flat(), batch_size=1
    )
    assert isinstance(servers[0], OracleServer) and servers[0] is not servers[1]


def test_run_folder_summary_and_report(tmp_path: Path) -> None:
    config = RunConfig(drafters=("ar", "oracle"), batch_sizes=(1, 2), oracle_cap_tokens=8)
    entries = run_replay(
        _sessions(),
        config,
        tmp_path,
        tokenizer=None,
        cost_model_for=lambda ctx: Flat(),
        progress=False,
    )
    assert len(entries) == 2 * 2 * 2  # sources x drafters x batch sizes
    by = {(e["source"], e["drafter"], e["batch_size"]): e for e in entries}
    assert by[("src1", "ar", 1)]["speedup"] == pytest.approx(1.0)
    # src1 oracle. Session "a" (fold 0) sees "e"'s output 4 5 6 7 8 in its global corpus:
    # drafts 4 5 6 7, which covers its output (no bonus): 1 step. Session "e" (fold 1) sees
    # "a"'s 4 5 6 7: drafts them, commits them plus the bonus 8: 1 step. AR: 9 steps.
    o = by[("src1", "oracle", 1)]
    assert (o["num_steps"], o["num_output_tokens"], o["speedup"]) == (2, 9, pytest.approx(4.5))
    # B=2: both sessions in one batch step against AR's 5 (the longer session, 5 tokens).
    assert by[("src1", "oracle", 2)]["speedup"] == pytest.approx(5.0)
    assert o["per_agent"]["coder"]["mean_accept_length"] == pytest.approx(8 / 2)
    # src2: "b" (fold 0) output 2 2 2 sees "f"'s 2 2 2; with no split it would be alone.
    assert by[("src2", "oracle", 1)]["num_steps"] == 2
    config_json = json.loads((tmp_path / "config.json").read_text())
    assert "two-fold" in config_json["split"] and config_json["sources"]["src1"]["fold_sizes"] == [
        1, 1,
    ]  # fmt: skip
    steps = read_steps(tmp_path / o["steps_file"])
    assert [(r["session"], r["drafted"], r["committed"]) for r in steps] == [
        ("a", 4, 4), ("e", 4, 5),
    ]  # fmt: skip
    loaded = load_entries([tmp_path])
    table = format_table(loaded)
    assert "oracle" in table and "4.50x" in table
    assert "coder" in format_agent_table(loaded, batch_size=1)
    from agspec.lab.plots import write_plots

    paths = write_plots(loaded, tmp_path / "plots", ladder=["ar", "oracle"])
    assert {p.name for p in paths} == {"accept_by_turn.png", "speedup.png", "ablation-custom.png"}
    assert all(p.stat().st_size > 1000 for p in paths)


def test_registry_and_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown drafter"):
        RunConfig(drafters=("nope",))
    with pytest.raises(ValueError, match="batch sizes"):
        RunConfig(drafters=("ar",), batch_sizes=(0,))
    with pytest.raises(ValueError, match="unknown drafter"):
        make_server("nope", global_docs=[], tokenizer=None, cost_model=None, batch_size=1)
    with pytest.raises(ValueError, match="reserved"):
        register_drafter("oracle", DRAFTERS.get("ar"))
    with pytest.raises(ValueError, match="no summary.json"):
        load_entries(["/nonexistent-run-folder"])


def test_baseline_through_registry_matches_hand_count(tmp_path: Path) -> None:
    # PLD (HF: n-gram 2 then 1, 10 tokens) on prompt 1 2 3 4 and output 1 2 3 4 9:
    # step 1: last token 4 never occurred earlier -> no draft, commit 1;
    # step 2: "4 1" no, "1" at 0 -> draft 2 3 4 1 (rest of the text), accept 2 3 4, commit 2 3 4 9.
    pytest.importorskip("agspec.baselines.registry")
    sessions = [ReplaySession("a", (ReplayCall("x", "code", 0, [1, 2, 3, 4], [1, 2, 3, 4, 9]),))]
    config = RunConfig(drafters=("pld-hf",), batch_sizes=(1,), global_split="none")
    entries = run_replay(
        sessions,
        config,
        tmp_path,
        tokenizer=None,
        cost_model_for=lambda ctx: Flat(),
        progress=False,
    )
    e = entries[0]
    assert (e["num_steps"], e["num_accepted_tokens"]) == (2, 3)


def test_parallel_jobs_give_the_same_counts(tmp_path: Path) -> None:
    config = RunConfig(drafters=("ar", "oracle"), batch_sizes=(1, 2), oracle_cap_tokens=8)
    kwargs = dict(tokenizer=None, cost_model_for=lambda ctx: Flat(), progress=False)
    serial = run_replay(_sessions(), config, tmp_path / "serial", **kwargs)
    parallel = run_replay(_sessions(), config, tmp_path / "parallel", jobs=2, **kwargs)
    keys = ("source", "drafter", "batch_size", "num_steps", "num_accepted_tokens", "speedup")
    assert [[e[k] for k in keys] for e in serial] == [[e[k] for k in keys] for e in parallel]


def test_markdown_report_has_one_table_per_source(tmp_path: Path) -> None:
    from agspec.lab.report import format_markdown

    config = RunConfig(drafters=("ar", "oracle"), batch_sizes=(1, 2), oracle_cap_tokens=8)
    entries = run_replay(
        _sessions(),
        config,
        tmp_path,
        tokenizer=None,
        cost_model_for=lambda ctx: Flat(),
        progress=False,
    )
    text = format_markdown(entries)
    assert text.count("| drafter |") == 2 and "**src1**" in text and "**src2**" in text
    assert "| oracle | 4.50 | 4.00 | 4.50x | " in text  # src1: 9 tokens, 2 steps, 8 accepted


def test_a_profile_without_the_batch_size_is_warned_about(tmp_path: Path) -> None:
    from agspec.policy.costmodel import ProfileCostModel

    profile = ProfileCostModel.from_dict(
        {
            "format": "agspec-cost-profile",
            "version": 1,
            "backend": "llama.cpp",
            "model": "m",
            "device": "cpu",
            "context_tokens": 512,
            "batch_sizes": {"1": {"n_tokens": [1, 2, 4], "step_ms": [10.0, 20.0, 30.0]}},
        }
    )
    config = RunConfig(drafters=("ar",), batch_sizes=(1, 16))
    with pytest.warns(RuntimeWarning, match="no curve for batch size 16"):
        run_replay(
            _sessions()[:2], config, tmp_path, tokenizer=None,
            cost_model_for=lambda ctx: profile, progress=False,
        )  # fmt: skip


def test_spawned_workers_replay_as_the_parent_does(tmp_path: Path) -> None:
    # Workers started by `spawn` inherit nothing: the run's settings (here caps of 1 token,
    # which change the result) must reach them in their task state, not in module globals.
    pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")
    from agspec.lab.run import resolve_cost_model
    from agspec.policy.caps import ProfiledCap
    from agspec.tokenizers import get_tokenizer

    phrase = list(range(10, 50))

    def call(turn: int) -> ReplayCall:
        return ReplayCall("coder", "code", turn, phrase + [1] + phrase, phrase + [2])

    sessions = [ReplaySession(sid, (call(0), call(1)), source="src1") for sid in ("a", "e", "b")]
    config = RunConfig(drafters=("agspec-paper", "pld-hf"), batch_sizes=(1, 2))
    kwargs = dict(
        tokenizer=get_tokenizer("qwen2.5"),
        cost_model_for=lambda n: resolve_cost_model("h200-qwen2.5-32b", context_tokens=n),
        progress=False,
    )
    caps = ProfiledCap(default_cap_tokens=1)
    keys = ("drafter", "batch_size", "num_steps", "num_drafted_tokens", "num_accepted_tokens")

    def counts(entries: list[dict]) -> list[list]:
        return [[e[k] for k in keys] for e in entries]

    free = run_replay(sessions, config, tmp_path / "free", **kwargs)
    capped = run_replay(sessions, config, tmp_path / "capped", caps=caps, **kwargs)
    spawned = run_replay(
        sessions, config, tmp_path / "spawned", caps=caps, jobs=2, start_method="spawn", **kwargs
    )
    assert counts(spawned) == counts(capped)
    # The caps matter for AgSpec (at most 1 draft token per step), not for PLD.
    paper = [i for i, e in enumerate(capped) if e["drafter"] == "agspec-paper"]
    assert all(capped[i]["num_drafted_tokens"] <= capped[i]["num_steps"] for i in paper)
    assert all(counts(free)[i] != counts(capped)[i] for i in paper)
    assert counts(free)[2:] == counts(capped)[2:]
    with pytest.raises(ValueError, match="start_method"):
        run_replay(sessions, config, tmp_path / "bad", start_method="thread", **kwargs)
