"""The policy's batch entry points against their one-request forms, float for float:
`observe_batch`, `apply_batch`, `note_steps`, `draft_lengths`, and the batch cost rule
priced once per step (`batch_prices` + `best_length_at_prices`) against the rule as a
plain loop."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agspec.policy import cost_length
from agspec.policy.caps import ProfiledCap
from agspec.policy.length import DraftLengthPolicy, LengthDecision
from agspec.policy.scale import OnlineScale, OnlineScaleConfig
from agspec.policy.survival import MatchSurvival

AGENTS = ["coder", "tester", "reviewer"]

observations = st.lists(
    st.tuples(
        st.sampled_from(AGENTS),
        st.integers(0, 200),  # match tokens
        st.integers(0, 40),  # drafted
        st.integers(-1, 40),  # accepted (may exceed the draft: clipped, as `observe` does)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(observations, st.integers(1, 33))
def test_observe_batch_is_observe_one_at_a_time(obs, max_tokens):
    one, many = MatchSurvival(max_tokens=max_tokens), MatchSurvival(max_tokens=max_tokens)
    for s in (one, many):  # curves cached before: the observations must drop them
        for agent in AGENTS:
            s.curve(agent, 9)
    for agent, m, d, a in obs:
        one.observe(agent, m, drafted_tokens=d, accepted_tokens=a)
    many.observe_batch([o[0] for o in obs], [o[1] for o in obs], [o[2] for o in obs],
                       [o[3] for o in obs])  # fmt: skip
    assert many.counts == one.counts
    assert many.version == one.version
    for agent in AGENTS:
        for m in (0, 1, 3, 9, 40, 100):
            assert many.curve(agent, m) == one.curve(agent, m)


@settings(max_examples=100, deadline=None)
@given(observations, st.integers(1, 20))
def test_a_curve_head_is_the_curve_s_first_entries(obs, head):
    s = MatchSurvival(max_tokens=16)
    for agent, m, d, a in obs:
        s.observe(agent, m, drafted_tokens=d, accepted_tokens=a)
    full = copy.deepcopy(s).curve("coder", 9)
    got = s.curve("coder", 9, head)
    assert len(got) >= min(head, 16) and got == full[: len(got)]
    assert s.curve("coder", 9) == full  # a later whole curve is whole


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(AGENTS), st.integers(0, 12), st.integers(0, 12), st.booleans()),
        max_size=60,
    ),
    st.floats(0.01, 0.99),
    st.sampled_from([OnlineScaleConfig(), OnlineScaleConfig(step_size=0.5, alpha_max=2.0)]),
)
def test_apply_batch_is_apply_one_at_a_time(steps, p_star, config):
    one = OnlineScale(p_star=p_star, config=config)
    many = OnlineScale(p_star=p_star, config=config)
    steps = [(agent, d, min(a, d), c) for agent, d, a, c in steps]
    for agent, d, a, censored in steps:
        one.apply(agent, d, a, censored)
    many.apply_batch(*zip(*steps)) if steps else None
    assert many.scales == one.scales


def cost_policy(batch_size: int = 8) -> DraftLengthPolicy:
    costs = [1.0, 1.02, 1.05, 1.09, 1.14, 1.2, 1.27, 1.35, 1.44, 1.2, 1.3, 1.7, 1.8, 2.5,
             2.6, 2.7, 3.9, 4.0]  # fmt: skip
    return DraftLengthPolicy(
        "cost", step_costs=costs, survival=MatchSurvival(max_tokens=16), batch_size=batch_size
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16), st.integers(1, 17)), max_size=80))
def test_note_steps_is_note_step_one_at_a_time(steps):
    one, many = cost_policy(), cost_policy()
    for d, c in steps:
        one.note_step(d, c)
    table = many.cost_table("coder", 1)  # at the starting means
    before = (many.mean_draft, many.mean_committed)
    many.note_steps([d for d, _ in steps], [c for _, c in steps])
    assert (many.mean_draft, many.mean_committed) == (one.mean_draft, one.mean_committed)
    # A table is kept exactly while the means hold, and is the rule's at the new ones.
    again = many.cost_table("coder", 1)
    assert (again is table) == ((many.mean_draft, many.mean_committed) == before)
    fresh = cost_policy()
    fresh.mean_draft, fresh.mean_committed = many.mean_draft, many.mean_committed
    assert again == fresh.cost_table("coder", 1)


requests = st.lists(
    st.tuples(
        st.sampled_from(AGENTS),
        st.integers(1, 100),  # match tokens
        st.integers(0, 20),  # available tokens
        st.one_of(st.none(), st.integers(0, 20)),  # an engine's own bound
    ),
    max_size=40,
)


def learned(policy: DraftLengthPolicy) -> DraftLengthPolicy:
    for i in range(60):
        agent = AGENTS[i % 3]
        policy.observe_tokens(agent, 12, i % 5 == 0, 1 + (i * 7) % 70, (i * 5) % 13)
        policy.note_step(12, 1 + (i * 5) % 13) if policy.variant == "cost" else None
    return policy


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.sampled_from(["cost", "cap+scale", "cap", "static", "match"]),
    st.sampled_from([1, 8, 64]),
    st.booleans(),
)
def test_draft_lengths_is_the_one_request_rule(reqs, variant, batch_size, engines):
    if variant == "cost":
        policy = learned(cost_policy(batch_size))
    else:
        caps = ProfiledCap(default_cap_tokens=6)
        caps.set("tester", model="", batch_size=batch_size, cap_tokens=11)
        scale = OnlineScale(p_star=0.3, scales={"coder": 0.4, "tester": 2.5})
        policy = learned(DraftLengthPolicy(variant, caps=caps, scale=scale, batch_size=batch_size))
    twin = copy.deepcopy(policy)
    cap_of = {a: policy.caps.cap_for(a, model="", batch_size=batch_size) for a in AGENTS}
    expected = []
    for agent, m, k, e in reqs:
        want = policy.length_tokens(agent, m, k, e if engines else None, cap_of[agent])
        if variant == "cost" and want:
            want = policy.cost_length(agent, m, want)
        expected.append(want)
    got = twin.draft_lengths(
        [r[0] for r in reqs],
        [r[1] for r in reqs],
        [r[2] for r in reqs],
        [cap_of[r[0]] for r in reqs],
        [r[3] for r in reqs] if engines else None,
    )
    assert got == expected


def interp(costs: Sequence[float], y: float) -> float:
    if y <= 0:
        return costs[0]
    i = min(int(y), len(costs) - 2)
    return costs[i] + (costs[i + 1] - costs[i]) * (y - i)


def step_cost(step_costs, mean_draft):
    """C(mean draft), never below the cheapest measured step (a falling profile's
    extrapolation can reach 0)."""
    c = interp(step_costs, mean_draft)
    return c if c > 0.0 else min(step_costs)


def prices_as_a_loop(step_costs, *, batch_size, mean_draft, mean_committed):
    b = float(batch_size)
    x0 = mean_draft * (b - 1.0) / b
    base = interp(step_costs, x0)
    rho = b * mean_committed / step_cost(step_costs, mean_draft)
    return [0.0] + [
        rho * (interp(step_costs, x0 + n / b) - base) for n in range(1, len(step_costs))
    ]


def batch_rule_as_a_loop(curve, step_costs, limit, *, batch_size, mean_draft, mean_committed):
    """`best_length_in_batch` as it was written before its prices were shared (the
    oracle: the same float operations, one request at a time)."""
    b = float(batch_size)
    limit = min(limit, len(curve), len(step_costs) - 1)
    x0 = mean_draft * (b - 1.0) / b
    base = interp(step_costs, x0)
    rho = b * mean_committed / step_cost(step_costs, mean_draft)
    best, best_value, expected = 0, 0.0, 0.0
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected - rho * (interp(step_costs, x0 + n / b) - base)
        if value > best_value:
            best, best_value = n, value
    return best


# (curve, step costs after the first, limit, batch size, mean draft, mean committed)
BATCH_RULE_CASES = (
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20).map(
        lambda ps: [math.prod(ps[: k + 1]) for k in range(len(ps))]
    ),
    st.lists(st.floats(0.5, 5.0), min_size=2, max_size=20),
    st.integers(-1, 24),
    st.integers(1, 128),
    st.floats(-1.0, 30.0),
    st.floats(0.5, 20.0),
)


@settings(max_examples=300, deadline=None)
@example([0.5, 0.25], [1.0, 1.5, 2.0], 2, 4, -1.0, 1.0)  # x0 + L/B <= 0: C(0)
@example([0.0], [1.0, 0.5], 0, 1, 2.0, 0.5)  # a falling profile extrapolated to C = 0
@given(*BATCH_RULE_CASES)
def test_batch_rule_at_shared_prices_is_the_loop(curve, raw, limit, b, mean_draft, mean_c):
    costs = [1.0, *raw[1:]]
    kw = {"batch_size": b, "mean_draft": mean_draft, "mean_committed": mean_c}
    want = batch_rule_as_a_loop(curve, costs, limit, **kw)
    assert cost_length.best_length_in_batch(curve, costs, limit, **kw) == want
    # Prices up to the limit only (as the policy keeps them) give the same answer.
    assert cost_length.batch_prices(costs, **kw) == prices_as_a_loop(costs, **kw)
    head = cost_length.batch_prices(costs, **kw, max_tokens=max(limit, 0))
    assert head == prices_as_a_loop(costs, **kw)[: len(head)]
    assert cost_length.best_length_at_prices(curve, head, limit) == want


def test_cost_length_reprices_when_the_batch_state_moves():
    policy = learned(cost_policy(16))
    for step in range(40):
        if step % 5 == 4:  # the other mean alone, set by hand (no cache cleared)
            policy.mean_committed = 1.0 + step / 7.0
        for m, k in ((3, 16), (20, 16), (20, 4), (70, 9)):
            curve = policy.survival.curve("coder", m)
            prices = policy.cost.batch_prices(k)
            assert (
                prices
                == prices_as_a_loop(
                    policy.step_costs,
                    batch_size=16,
                    mean_draft=policy.mean_draft,
                    mean_committed=policy.mean_committed,
                )[: len(prices)]
            )
            assert policy.cost_length("coder", m, k) == batch_rule_as_a_loop(
                curve,
                policy.step_costs,
                k,
                batch_size=16,
                mean_draft=policy.mean_draft,
                mean_committed=policy.mean_committed,
            )
        if step % 3:
            policy.note_step(step % 17, 1 + step % 5)
        else:  # one mean moves alone, set by hand
            policy.mean_draft = step / 3.0


@settings(max_examples=200, deadline=None)
@given(*BATCH_RULE_CASES)
def test_a_table_of_best_lengths_is_the_rule_at_every_limit(
    curve, raw, limit, b, mean_draft, mean_c
):
    costs = [1.0, *raw[1:]]
    kw = {"batch_size": b, "mean_draft": mean_draft, "mean_committed": mean_c}
    table = cost_length.best_lengths_at_prices(curve, cost_length.batch_prices(costs, **kw), limit)
    top = min(max(limit, 0), len(curve), len(costs) - 1)
    assert table == [batch_rule_as_a_loop(curve, costs, r, **kw) for r in range(top + 1)]
    table = cost_length.best_lengths(curve, costs, limit)
    assert table == [cost_length.best_length(curve, costs, r) for r in range(top + 1)]


@settings(max_examples=60, deadline=None)
@given(
    observations,
    st.sampled_from([1, 16]),
    st.lists(st.tuples(st.sampled_from(AGENTS), st.integers(1, 200)), min_size=1, max_size=12),
    st.lists(st.integers(0, 20), min_size=1, max_size=4),
)
def test_cost_tables_are_the_rule_for_every_retrieved_length(obs, b, requests, uptos):
    """The tables a batch step reads (grown as later requests ask for more) answer every
    retrieved length as the rule written as a loop over the learned curve."""
    policy = cost_policy(b)
    for agent, m, d, a in obs:
        policy.observe(agent, LengthDecision(d, None, False, m), a)
        policy.note_step(d, max(a, 0) + 1)
    bound = policy.cost_bound_tokens
    agents, matches = [a for a, _ in requests], [m for _, m in requests]
    for upto in uptos:  # shorter tables first, then longer: they grow
        tables = policy.cost_tables(agents, matches, [upto] * len(agents))
        for agent, m, table in zip(agents, matches, tables):
            curve = copy.deepcopy(policy.survival).curve(agent, m)
            for r in range(min(upto, bound) + 1):
                if b == 1:
                    want = cost_length.best_length(curve, policy.step_costs, r)
                else:
                    want = batch_rule_as_a_loop(
                        curve, policy.step_costs, r, batch_size=b,
                        mean_draft=policy.mean_draft, mean_committed=policy.mean_committed,
                    )  # fmt: skip
                assert table[r] == want
                assert policy.cost_length(agent, m, r) == want
            # A longer retrieval drafts as the longest the rule considers.
            assert policy.cost_length(agent, m, bound + 5) == policy.cost_table(agent, m)[bound]


@settings(max_examples=60, deadline=None)
@given(observations, st.sampled_from([1, 16]), st.integers(1, 20))
def test_refreshed_tables_are_the_tables_of_the_new_state(obs, b, upto):
    """`refresh_cost_tables` (run while the native advance works) recomputes the last
    state's tables at the new one: each as a policy that never held them computes it."""
    policy = cost_policy(b)
    for agent in AGENTS:
        for m in (1, 5, 40):
            policy.cost_table(agent, m, upto)
    keys = {k: len(t) for k, t in policy.cost.tables.items()}
    for agent, m, d, a in obs:
        policy.observe(agent, LengthDecision(d, None, False, m), a)
        policy.note_step(d, max(a, 0) + 1)
    policy.refresh_cost_tables()
    fresh = copy.deepcopy(policy)
    fresh.cost.forget_tables()
    assert set(policy.cost.tables) == set(keys)  # the same keys, as far as they went
    for (agent, bucket), table in policy.cost.tables.items():
        assert len(table) == keys[(agent, bucket)]
        m = 1 << (bucket - 1)
        assert table == fresh.cost_table(agent, m, upto)[: len(table)]
