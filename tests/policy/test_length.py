"""Draft length: the cap from known acceptance curves, the scale's fixed point, the policy."""

from __future__ import annotations

import json
import logging
import math
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.policy.caps import (
    AcceptanceRecord,
    CapsFileError,
    ProfiledCap,
    acceptance_curve,
    cap_from_curve,
)
from agspec.policy.length import DraftLengthPolicy, atomic_write_text
from agspec.policy.scale import OnlineScale, OnlineScaleConfig

# ----------------------------------------------------------------------------- cap


def paper_example_records() -> list[AcceptanceRecord]:
    """Ten steps, all offering 20 tokens: P(r >= 11) = 0.3 and P(r >= 12) = 0.2.

    The paper's §3.2 example (numbers reconstructed; the stored text drops its math): with
    p* = 0.25 the 11th token returns 0.3 > 0.25 tokens for its cost, the 12th only 0.2, so
    the cap is 11.
    """
    return [AcceptanceRecord(r, 20) for r in (20, 20, 11, 5, 5, 5, 5, 5, 5, 5)]


def test_curve_plain_fractions() -> None:
    curve = acceptance_curve(paper_example_records())
    assert len(curve) == 20
    assert curve[:5] == pytest.approx([1.0] * 5)
    assert curve[5:11] == pytest.approx([0.3] * 6)  # k = 6..11
    assert curve[11:] == pytest.approx([0.2] * 9)  # k = 12..20


def test_cap_paper_example() -> None:
    curve = acceptance_curve(paper_example_records())
    assert cap_from_curve(curve, 0.25) == 11
    assert cap_from_curve(curve, 0.3) == 5  # strictly above p*
    assert cap_from_curve(curve, 0.1) == 20
    assert cap_from_curve(curve, 0.99) == 5
    assert cap_from_curve([0.05, 0.01], 0.5) == 1  # never below one token
    assert cap_from_curve([], 0.5) == 1
    with pytest.raises(ValueError, match="p_star"):
        cap_from_curve(curve, 1.5)


def test_curve_censoring_by_available_tokens() -> None:
    # Step A offered 2 tokens and both matched: it says nothing about position 3.
    recs = [AcceptanceRecord(2, 2), AcceptanceRecord(5, 8), AcceptanceRecord(0, 8)]
    curve = acceptance_curve(recs)
    # k=1: 2 of 3 at risk match; k=2: 2 of 2; k=3: only B at risk, it matches.
    assert curve[:3] == pytest.approx([2 / 3, 2 / 3, 2 / 3])
    # k=6: B (r=5) is the only one at risk and fails.
    assert curve[5] == 0.0
    # The naive fraction would have said 1/3 at k=3.


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=30))
def test_curve_equals_plain_fraction_without_censoring(rs: list[int]) -> None:
    recs = [AcceptanceRecord(r, 12) for r in rs]
    curve = acceptance_curve(recs)
    for k in range(1, 13):
        assert curve[k - 1] == pytest.approx(sum(r >= k for r in rs) / len(rs))
    assert all(b <= a for a, b in zip(curve, curve[1:], strict=False))


def test_record_validation() -> None:
    with pytest.raises(ValueError, match="cannot exceed"):
        AcceptanceRecord(5, 3)
    with pytest.raises(ValueError, match="reusable_tokens"):
        AcceptanceRecord(-1, 3)


def test_fit_and_caps_file_roundtrip(tmp_path: Path) -> None:
    caps = ProfiledCap(default_cap_tokens=8)
    got = caps.fit(
        {"coder": paper_example_records(), "empty": []},
        p_star=0.25,
        model="qwen2.5-7b",
        batch_size=16,
    )
    assert got == {"coder": 11}
    path = tmp_path / "caps.json"
    caps.save(path)
    again = ProfiledCap.load(path)
    assert again.default_cap_tokens == 8
    assert again.cap_for("coder", model="qwen2.5-7b", batch_size=16) == 11
    assert again.meta[("coder", "qwen2.5-7b", 16)]["num_records"] == 10
    # Nearest profiled batch size for the same agent and model; another model: default.
    assert again.cap_for("coder", model="qwen2.5-7b", batch_size=1) == 11
    assert again.cap_for("coder", model="gemma3-27b", batch_size=16) == 8


def test_unknown_agent_default_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caps = ProfiledCap(default_cap_tokens=5)
    with caplog.at_level(logging.INFO, logger="agspec.policy.caps"):
        assert caps.cap_for("ghost") == 5
        assert caps.cap_for("ghost") == 5
        assert caps.cap_for("other") == 5
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("'ghost'" in m for m in msgs) == 1
    assert sum("'other'" in m for m in msgs) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{broken", "not a readable JSON"),
        ('{"format": "x", "version": 1, "caps": []}', "format must be"),
        ('{"format": "agspec-caps", "version": 9, "caps": []}', "unsupported version"),
        ('{"format": "agspec-caps", "version": 1, "caps": [{"agent": "a"}]}', "bad caps entry"),
        (
            '{"format": "agspec-caps", "version": 1, "caps": [{"agent": "a", "model": "m",'
            ' "batch_size": 1, "cap_tokens": 0}]}',
            "bad caps entry",
        ),
    ],
)
def test_caps_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "caps.json"
    path.write_text(text)
    with pytest.raises(CapsFileError, match=message):
        ProfiledCap.load(path)
    with pytest.raises(CapsFileError, match="no such caps file"):
        ProfiledCap.load(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- scale


def test_scale_updates_by_hand() -> None:
    s = OnlineScale(p_star=0.2, config=OnlineScaleConfig(step_size=0.1))
    assert s.alpha("coder") == 1.0
    assert s.update("coder", drafted_tokens=5, accept_length=5) == pytest.approx(1.08)
    assert s.update("coder", drafted_tokens=5, accept_length=0) == pytest.approx(1.06)
    assert s.update("coder", drafted_tokens=5, accept_length=4) == pytest.approx(1.04)
    assert s.alpha("tester") == 1.0  # per agent
    # Nothing drafted: no verification of a draft, no update.
    assert s.update("coder", drafted_tokens=0, accept_length=0) == pytest.approx(1.04)


def test_scale_skip_on_censor() -> None:
    s = OnlineScale(p_star=0.2, config=OnlineScaleConfig(step_size=0.1))
    # Fully accepted but cut by the cap: the model might have taken more, skip.
    assert s.update("a", drafted_tokens=6, accept_length=6, censored_by_cap=True) == 1.0
    # A rejection at the cap still says the cap-length draft was too long: update.
    assert s.update("a", drafted_tokens=6, accept_length=2, censored_by_cap=True) == (
        pytest.approx(0.98)
    )


def test_scale_clipping() -> None:
    cfg = OnlineScaleConfig(step_size=0.5, alpha_min=0.5, alpha_max=1.5)
    s = OnlineScale(p_star=0.5, config=cfg)
    for _ in range(10):
        s.update("a", drafted_tokens=3, accept_length=3)
    assert s.alpha("a") == 1.5
    for _ in range(10):
        s.update("a", drafted_tokens=3, accept_length=0)
    assert s.alpha("a") == 0.5
    assert OnlineScale(p_star=0.5, config=cfg, scales={"b": 99.0}).alpha("b") == 1.5


def test_scale_input_errors() -> None:
    s = OnlineScale(p_star=0.3)
    with pytest.raises(ValueError, match="cannot exceed"):
        s.update("a", drafted_tokens=2, accept_length=3)
    with pytest.raises(ValueError, match="drafted_tokens"):
        s.update("a", drafted_tokens=-1, accept_length=0)
    with pytest.raises(ValueError, match="p_star"):
        OnlineScale(p_star=0.0)
    with pytest.raises(ValueError, match="alpha_min"):
        OnlineScaleConfig(alpha_min=2.0, alpha_max=1.0)


@pytest.mark.parametrize(("q", "p_star"), [(0.9, 0.3), (0.8, 0.1), (0.95, 0.5)])
def test_scale_fixed_point_on_bernoulli_stream(q: float, p_star: float) -> None:
    """Each draft token is accepted with probability q until the first rejection, so a
    d-token draft is fully accepted with probability q^d. α settles where that is p*."""
    rng = random.Random(1234)
    m = 10
    s = OnlineScale(p_star=p_star, config=OnlineScaleConfig(step_size=0.02))
    policy = DraftLengthPolicy("cap+scale", caps=ProfiledCap(default_cap_tokens=1000), scale=s)
    alphas, fulls = [], []
    for step in range(30_000):
        d = policy.draft_length("a", match_tokens=m, available_tokens=1000)
        accepted = 0
        while accepted < d.draft_tokens and rng.random() < q:
            accepted += 1
        policy.observe("a", d, accepted)
        if step >= 10_000:
            alphas.append(s.alpha("a"))
            fulls.append(accepted == d.draft_tokens)
    # Oracle: the draft lengths d with q^d bracketing p*.
    d_star = math.log(p_star) / math.log(q)
    assert sum(fulls) / len(fulls) == pytest.approx(p_star, abs=0.03)
    mean_alpha = sum(alphas) / len(alphas)
    assert math.floor(d_star) / m - 0.1 <= mean_alpha <= (math.floor(d_star) + 2) / m


# ----------------------------------------------------------------------------- persistence


def test_scales_persist(tmp_path: Path) -> None:
    path = tmp_path / "state" / "scales.json"
    s = OnlineScale(p_star=0.25)
    s.update("coder", drafted_tokens=4, accept_length=4)
    s.save(path)
    again = OnlineScale.load(path, p_star=0.25)
    assert again.scales == s.scales
    assert OnlineScale.load(tmp_path / "absent.json", p_star=0.25).scales == {}


@pytest.mark.parametrize(
    "text",
    [
        "{half a file",
        '{"format": "agspec-scales", "version": 1, "scales": {"a": "big"}}',
        '{"format": "agspec-scales", "version": 7, "scales": {}}',
        '["not", "an", "object"]',
        "\udcff",
    ],
)
def test_corrupt_scales_file_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "scales.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.warns(RuntimeWarning, match="ignoring corrupt scales file"):
        s = OnlineScale.load(path, p_star=0.3)
    assert s.scales == {}
    assert s.alpha("a") == 1.0


def test_atomic_write_keeps_old_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scales.json"
    OnlineScale(p_star=0.3, scales={"a": 2.0}).save(path)
    before = path.read_text()
    seen: list[tuple[str, str]] = []

    def failing_replace(src: str, dst: str) -> None:
        seen.append((str(src), str(dst)))
        raise OSError("disk pulled out")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk pulled out"):
        OnlineScale(p_star=0.3, scales={"a": 3.0}).save(path)
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["scales.json"]  # the temp file was removed
    # The temp file lived beside the target (same filesystem, so the rename is atomic).
    assert Path(seen[0][0]).parent == tmp_path and seen[0][1] == str(path)


def test_atomic_write_text_roundtrip(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    atomic_write_text(target, json.dumps({"x": 1}))
    atomic_write_text(target, json.dumps({"x": 2}))
    assert json.loads(target.read_text()) == {"x": 2}
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would make it


# ----------------------------------------------------------------------------- policy


def make_policy(variant: str, *, alpha: float = 0.5, cap: int = 6) -> DraftLengthPolicy:
    return DraftLengthPolicy(
        variant,
        caps=ProfiledCap(default_cap_tokens=cap),
        scale=OnlineScale(p_star=0.2, scales={"coder": alpha}),
        static_tokens=4,
    )


@pytest.mark.parametrize(
    ("variant", "m", "avail", "engine", "expected"),
    [
        ("cap+scale", 20, 9, None, 6),  # floor(0.5·20)=10 -> cap 6
        ("cap+scale", 5, 9, None, 2),  # floor(2.5) = 2
        ("cap+scale", 1, 9, None, 1),  # floor(0.5) = 0 -> at least 1
        ("cap+scale", 20, 3, None, 3),  # tokens available after the match
        ("cap+scale", 20, 9, 4, 4),  # the engine's own length
        ("cap+scale", 0, 9, None, 0),  # no match, no draft
        ("cap", 5, 9, None, 5),  # α ignored
        ("cap", 20, 9, None, 6),
        ("match", 20, 30, None, 20),  # no cap
        ("match", 20, 9, None, 9),
        ("static", 20, 9, None, 4),
        ("static", 20, 2, None, 2),
        ("static", 0, 9, None, 0),
    ],
)
def test_policy_variants(
    variant: str, m: int, avail: int, engine: int | None, expected: int
) -> None:
    pol = make_policy(variant)
    d = pol.draft_length("coder", match_tokens=m, available_tokens=avail, engine_max_tokens=engine)
    assert d.draft_tokens == expected


def test_policy_censor_flag_and_observe() -> None:
    pol = make_policy("cap+scale", alpha=1.0, cap=6)
    d = pol.draft_length("coder", match_tokens=20, available_tokens=30)
    assert (d.draft_tokens, d.cap_tokens, d.censored_by_cap) == (6, 6, True)
    pol.observe("coder", d, 6)  # full accept at the cap: skipped
    assert pol.scale is not None and pol.scale.alpha("coder") == 1.0
    d2 = pol.draft_length("coder", match_tokens=4, available_tokens=30)
    assert (d2.draft_tokens, d2.censored_by_cap) == (4, False)
    pol.observe("coder", d2, 4)
    assert pol.scale.alpha("coder") == pytest.approx(1.0 + 0.05 * 0.8)
    # Variants without a scale never touch it.
    cap_only = make_policy("cap", alpha=1.0)
    cap_only.observe("coder", d2, 0)
    assert cap_only.scale is not None and cap_only.scale.alpha("coder") == 1.0


def test_policy_uses_profiled_caps_per_agent() -> None:
    caps = ProfiledCap(default_cap_tokens=3)
    caps.set("coder", model="m", batch_size=16, cap_tokens=11)
    pol = DraftLengthPolicy("cap", caps=caps, model="m", batch_size=16)
    assert pol.draft_length("coder", match_tokens=30, available_tokens=30).draft_tokens == 11
    assert pol.draft_length("tester", match_tokens=30, available_tokens=30).draft_tokens == 3


def test_policy_errors() -> None:
    with pytest.raises(ValueError, match="unknown draft-length variant"):
        DraftLengthPolicy("greedy")
    with pytest.raises(ValueError, match="needs an OnlineScale"):
        DraftLengthPolicy("cap+scale")
    pol = make_policy("cap")
    with pytest.raises(ValueError, match="match_tokens"):
        pol.draft_length("a", match_tokens=-1, available_tokens=3)
    with pytest.raises(ValueError, match="available_tokens"):
        pol.draft_length("a", match_tokens=1, available_tokens=-3)
    with pytest.raises(ValueError, match="engine_max_tokens"):
        pol.draft_length("a", match_tokens=1, available_tokens=3, engine_max_tokens=-1)
