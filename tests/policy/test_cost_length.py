"""Cost-aware draft length: the expected-throughput argmax against brute force, the
learned acceptance curves by hand and on a stream they must recover, persistence, and the
"cost" variant of the policy."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.policy import cost_length
from agspec.policy.length import DraftLengthPolicy


def _expected_rate(curve: list[float], costs: list[float], n: int) -> float:
    return (1.0 + sum(curve[:n])) / costs[n]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12).map(
        lambda ps: [math.prod(ps[: k + 1]) for k in range(len(ps))]  # non-increasing
    ),
    st.lists(st.floats(0.5, 20.0), min_size=2, max_size=14),
    st.integers(0, 15),
)
def test_best_length_is_the_brute_force_argmax(
    curve: list[float], raw_costs: list[float], limit: int
) -> None:
    costs = [1.0, *raw_costs[1:]]
    got = cost_length.best_length(curve, costs, limit)
    top = min(limit, len(curve), len(costs) - 1)
    rates = [_expected_rate(curve, costs, n) for n in range(top + 1)]
    assert 0 <= got <= top
    best = max(rates)
    assert rates[got] >= best - 1e-12
    # Ties go to the shorter draft (up to float summation order).
    assert all(rates[n] < rates[got] + 1e-12 for n in range(got))


def test_best_length_on_the_cpu_profile_shape() -> None:
    # Costs shaped like Qwen2.5-Coder-0.5B on llama.cpp, 2 threads (docs/costmodel-profiles.md): a
    # 2-token verification costs 2.4 decode steps, a 16-token one 4.9.
    costs = [1.0, 2.38, 2.97, 3.18, 4.09, 4.56, 4.85, 4.16] + [4.9] * 8 + [4.91]
    coin = [0.5**k for k in range(1, 17)]  # each token a coin flip
    assert cost_length.best_length(coin, costs, 16) == 0
    sure = [0.99**k for k in range(1, 17)]
    # Nearly sure tokens: the 8-token step (cheaper than 7) or longer wins, never 1-6.
    assert cost_length.best_length(sure, costs, 16) >= 7
    assert cost_length.best_length(sure, costs, 1) == 0  # 1.99 tokens for 2.38 steps: no
    assert cost_length.best_length(sure, costs, 3) == 3  # 3.94 tokens for 3.18 steps: yes


def test_match_survival_by_hand() -> None:
    s = cost_length.MatchSurvival(max_tokens=3, prior_weight=2.0)
    # Prior for a 9-token match (bucket 8-15, q = 8/9): at risk 2, 16/9, 128/81.
    q = 8 / 9
    assert s.curve("coder", 9) == pytest.approx([q, q**2, q**3])
    s.observe("coder", 9, drafted_tokens=3, accepted_tokens=1)  # k=1 survived, k=2 failed
    s.observe("coder", 12, drafted_tokens=1, accepted_tokens=1)  # same bucket; k=1 only
    at_risk = [2 + 2, 2 * q + 1, 2 * q**2]
    survived = [2 * q + 2, 2 * q**2 + 0, 2 * q**3]
    want, p = [], 1.0
    for n, h in zip(at_risk, survived):
        p *= h / n
        want.append(p)
    assert s.curve("coder", 15) == pytest.approx(want)
    # Other agents and other buckets are untouched.
    assert s.curve("reviewer", 9) == pytest.approx([q, q**2, q**3])
    assert s.curve("coder", 16) == pytest.approx([16 / 17, (16 / 17) ** 2, (16 / 17) ** 3])
    with pytest.raises(ValueError, match="prior_weight"):
        cost_length.MatchSurvival(prior_weight=0)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(0, 2**31 - 1))
def test_match_survival_learns_a_geometric_stream(q: float, seed: int) -> None:
    """Run lengths with P(r >= k) = q^k, censored at the draft length: the estimate
    converges to q^k (the prior's weight fades)."""
    rng = random.Random(seed)
    s = cost_length.MatchSurvival(max_tokens=6, prior_weight=4.0)
    for _ in range(4000):
        r = 0
        while r < 6 and rng.random() < q:
            r += 1
        d = rng.randint(1, 6)
        s.observe("a", 1, drafted_tokens=d, accepted_tokens=min(r, d))
    curve = s.curve("a", 1)
    for k in (1, 2, 3):
        assert curve[k - 1] == pytest.approx(q**k, abs=0.05)


def test_cost_policy_trims_to_the_expected_throughput_optimum() -> None:
    costs = [1.0, 3.0, 3.2, 3.4, 3.6]
    pol = DraftLengthPolicy("cost", step_costs=costs)
    decision = pol.draft_length("coder", match_tokens=20, available_tokens=64)
    assert decision.draft_tokens == 4  # the upper bound: what the costs cover
    assert decision.match_tokens == 20
    # Prior for a 20-token match (q = 16/17): (1 + Σ q^k, k ≤ 4) / 3.6 > 1: draft all 4.
    assert pol.cost_length("coder", 20, 4) == 4
    assert pol.cost_length("coder", 1, 4) == 0  # q = 1/2: never pays at these costs
    # Every draft from long matches rejected at once: the agent stops drafting there.
    for _ in range(20):
        pol.observe("coder", pol.draft_length("coder", match_tokens=20, available_tokens=4), 0)
    assert pol.cost_length("coder", 20, 4) == 0
    assert pol.cost_length("tester", 20, 4) == 4  # per agent


def test_cost_policy_errors() -> None:
    with pytest.raises(ValueError, match="step_costs"):
        DraftLengthPolicy("cost")
    with pytest.raises(ValueError, match="finite"):
        DraftLengthPolicy("cost", step_costs=[1.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        DraftLengthPolicy("cost", step_costs=[1.0, -2.0])


def test_match_survival_persists_and_survives_corruption(tmp_path: Path) -> None:
    path = tmp_path / "curves.json"
    s = cost_length.MatchSurvival(max_tokens=4)
    s.observe("coder", 9, drafted_tokens=4, accepted_tokens=2)
    s.observe("tester", 1, drafted_tokens=2, accepted_tokens=0)
    s.save(path)
    back = cost_length.MatchSurvival.load(path, max_tokens=4)
    for agent, m in (("coder", 9), ("tester", 1), ("coder", 40)):
        assert back.curve(agent, m) == pytest.approx(s.curve(agent, m))
    # Missing: the prior, silently.
    fresh = cost_length.MatchSurvival.load(tmp_path / "none.json", max_tokens=4)
    assert fresh.curve("coder", 9) == pytest.approx(
        cost_length.MatchSurvival(max_tokens=4).curve("coder", 9)
    )
    # Corrupt, truncated, another max_tokens, impossible counts: warned about, ignored.
    text = path.read_text()
    bad_docs = [
        text[: len(text) // 2],
        text.replace('"version": 1', '"version": 7'),
        json.dumps(
            {
                **json.loads(text),
                "curves": [
                    {"agent": "a", "bucket": 1, "at_risk": [1, 1, 1, 1], "survived": [2, 1, 1, 1]}
                ],
            }
        ),
        json.dumps(
            {
                **json.loads(text),
                "curves": [{"agent": "a", "bucket": 99, "at_risk": [1] * 4, "survived": [1] * 4}],
            }
        ),
    ]
    for bad in bad_docs:
        path.write_text(bad)
        with pytest.warns(RuntimeWarning, match="ignoring acceptance curves"):
            got = cost_length.MatchSurvival.load(path, max_tokens=4)
        assert got.curve("coder", 9) == pytest.approx(fresh.curve("coder", 9))
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match="max_tokens"):
        cost_length.MatchSurvival.load(path, max_tokens=8)


def _interp_oracle(costs: list[float], y: float) -> float:
    if y <= 0:
        return costs[0]
    i = min(int(y), len(costs) - 2)
    return costs[i] + (costs[i + 1] - costs[i]) * (y - i)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12).map(
        lambda ps: [math.prod(ps[: k + 1]) for k in range(len(ps))]
    ),
    st.lists(st.floats(0.0, 3.0), min_size=1, max_size=14),
    st.integers(0, 15),
    st.integers(2, 64),
    st.floats(0.0, 12.0),
    st.floats(1.0, 12.0),
)
def test_best_length_in_batch_is_the_brute_force_argmax(
    curve: list[float],
    steps: list[float],
    limit: int,
    batch: int,
    mean_draft: float,
    mean_committed: float,
) -> None:
    costs = [1.0]
    for d in steps:  # non-decreasing costs, as a batch's are
        costs.append(costs[-1] + d)
    got = cost_length.best_length_in_batch(
        curve, costs, limit, batch_size=batch, mean_draft=mean_draft,
        mean_committed=mean_committed,
    )  # fmt: skip
    top = min(limit, len(curve), len(costs) - 1)
    x0 = mean_draft * (batch - 1) / batch
    rho = batch * mean_committed / _interp_oracle(costs, mean_draft)
    values = [
        sum(curve[:n]) - rho * (_interp_oracle(costs, x0 + n / batch) - _interp_oracle(costs, x0))
        for n in range(top + 1)
    ]
    assert 0 <= got <= top
    assert values[got] >= max(values) - 1e-9


def test_batch_rule_drafts_longer_than_pricing_the_whole_batch() -> None:
    """At B = 16 one request's draft moves the step's mean by L/16: pricing it as if all
    16 drafted L (the B = 1 rule on step_cost(n, 16)) drafts shorter."""
    costs = [1.0 + 0.2 * n for n in range(33)]  # a batch that is already compute-bound
    curve = [0.9**k for k in range(1, 33)]
    whole = cost_length.best_length(curve, costs, 32)
    mine = cost_length.best_length_in_batch(
        curve, costs, 32, batch_size=16, mean_draft=whole, mean_committed=3.0
    )
    assert mine > whole


def test_cost_policy_tracks_the_batch() -> None:
    costs = [1.0 + 0.1 * n for n in range(17)]
    pol = DraftLengthPolicy("cost", step_costs=costs, batch_size=16)
    assert (pol.mean_draft, pol.mean_committed) == (0.0, 1.0)
    for _ in range(2000):
        pol.note_step(8, 5)
    assert pol.mean_draft == pytest.approx(8.0, abs=0.01)
    assert pol.mean_committed == pytest.approx(5.0, abs=0.01)
    # A long match for an agent with no history: the batch rule decides, not the ratio.
    n = pol.cost_length("coder", 20, 16)
    curve = pol.survival.curve("coder", 20)
    assert n == cost_length.best_length_in_batch(
        curve, pol.step_costs, 16, batch_size=16, mean_draft=pol.mean_draft,
        mean_committed=pol.mean_committed,
    )  # fmt: skip
