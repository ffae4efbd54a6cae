"""The simulator and the batch cost against sessions computed by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.simulator import StepTimer, ar_time_ms, replay_batched


class FixedDrafter:
    """Proposes `proposals[i]` at step i (then nothing); logs the lifecycle."""

    def __init__(self, log: list, proposals: Sequence[Sequence[int]]) -> None:
        self.log = log
        self.proposals = [list(p) for p in proposals]
        self.step = 0

    def begin(self, prompt_ids):
        self.log.append(("begin", list(prompt_ids)))

    def propose(self, max_tokens):
        p = self.proposals[self.step] if self.step < len(self.proposals) else []
        return p[:max_tokens]

    def accept(self, committed_ids):
        self.log.append(("accept", list(committed_ids)))
        self.step += 1

    def end(self):
        self.log.append(("end",))


class FixedSession:
    def __init__(self, server, session_id):
        self.server = server
        self.session_id = session_id

    def open_artifact(self, path, text):
        self.server.log.append(("open", self.session_id, path))

    def call(self, agent, role, turn):
        self.server.log.append(("call", self.session_id, agent, role, turn))
        key = (self.session_id, agent, turn)
        return FixedDrafter(self.server.log, self.server.plan.get(key, []))

    def end(self):
        self.server.log.append(("session_end", self.session_id))


class FixedServer:
    name = "fixed"

    def __init__(self, plan=None):
        self.plan = plan or {}
        self.log: list = []

    def session(self, session_id, *, emission_format="none"):
        return FixedSession(self, session_id)


class Flat:
    """Every step costs 1, whatever its size: speedup = AR steps / spec steps."""

    def step_cost(self, n_tokens, batch_size):
        return 1.0


class Linear:
    """Toy roofline: 1 + 0.1 per extra token per request, + 0.05 per extra request."""

    def step_cost(self, n_tokens, batch_size):
        return 1.0 + 0.1 * (n_tokens - 1) * batch_size + 0.05 * (batch_size - 1)


def _call(agent, turn, out, prompt=(1, 2), artifacts=()):
    return ReplayCall(agent, "r", turn, list(prompt), list(out), tuple(artifacts))


def test_single_call_bonus_token_and_end_of_output() -> None:
    # Output 8 9 12 13 14; step 1 proposes 8 9 10 -> accept 2, commit 8 9 12;
    # step 2 proposes 13 14 99 -> covers the rest: accept 2, commit 13 14, no bonus.
    session = ReplaySession("s", (_call("a", 0, [8, 9, 12, 13, 14]),))
    server = FixedServer({("s", "a", 0): [[8, 9, 10], [13, 14, 99]]})
    res = replay_batched([(session, server)], batch_size=1, cost_model=Flat())
    rows = res.recorder.rows()
    assert [(r["drafted"], r["accepted"], r["committed"]) for r in rows] == [(3, 2, 3), (3, 2, 2)]
    assert [r["position"] for r in rows] == [0, 3]
    assert ("accept", [8, 9, 12]) in server.log and ("accept", [13, 14]) in server.log
    assert res.num_steps == 2 and res.num_output_tokens == 5
    assert res.mean_accept_length == 2.0
    assert res.spec_ms == 2.0 and res.ar_ms == 5.0 and res.speedup == 2.5
    assert res.speedup_full_batch == 2.5  # B=1: every step is a full batch


def test_empty_drafter_is_autoregressive() -> None:
    sessions = [
        ReplaySession("s1", (_call("a", 0, [5, 6, 7]), _call("b", 1, [8]))),
        ReplaySession("s2", (_call("a", 0, [1, 2]),)),
    ]
    server = FixedServer()
    for b in (1, 2, 4):
        res = replay_batched([(s, server) for s in sessions], batch_size=b, cost_model=Linear())
        assert res.num_steps == 6 and res.num_accepted_tokens == 0
        assert res.speedup == pytest.approx(1.0)
        assert res.spec_ms == pytest.approx(res.ar_ms)


def test_lifecycle_order_and_artifacts_opened_once_before_begin() -> None:
    art = ("f.py", "x = 1")
    session = ReplaySession(
        "s",
        (
            _call("a", 0, [4], artifacts=[art]),
            _call("a", 1, [], artifacts=[art]),  # same text again: not reopened
            _call("b", 2, [7], artifacts=[("f.py", "x = 2")]),
        ),
    )
    server = FixedServer()
    replay_batched([(session, server)], batch_size=1, cost_model=Flat())
    kinds = [e[0] if e[0] != "open" else ("open", e[2]) for e in server.log]
    assert kinds == [
        ("open", "f.py"), "call", "begin", "accept", "end",
        "call", "begin", "end",
        ("open", "f.py"), "call", "begin", "accept", "end",
        "session_end",
    ]  # fmt: skip


def test_batching_schedule_and_cost_by_hand() -> None:
    # B=2. s1: one call, output 10 tokens, drafts 4 correct tokens at every step ->
    #   steps commit 5,5 (2 steps, drafted 4,4). s2: output 3 tokens, no drafts -> 3 steps.
    # s3: output 2 tokens, drafts 1 wrong token each step -> 2 steps (drafted 1,1).
    out1 = list(range(100, 110))
    sessions = [
        ReplaySession("s1", (_call("a", 0, out1),)),
        ReplaySession("s2", (_call("a", 0, [1, 2, 3]),)),
        ReplaySession("s3", (_call("a", 0, [7, 8]),)),
    ]
    server = FixedServer({("s1", "a", 0): [out1[0:4], out1[5:9]], ("s3", "a", 0): [[0], [0]]})
    res = replay_batched([(s, server) for s in sessions], batch_size=2, cost_model=Linear())
    # batch steps: t0: s1(4) s2(0); t1: s1(4) s2(0); t2: s3(1) s2(0); t3: s3(1).
    # mean rule: n = 1 + mean drafted.
    expected = (
        Linear().step_cost(1 + 2.0, 2)
        + Linear().step_cost(1 + 2.0, 2)
        + Linear().step_cost(1 + 0.5, 2)
        + Linear().step_cost(1 + 1.0, 1)
    )
    assert res.num_batch_steps == 4
    assert res.spec_ms == pytest.approx(expected)
    # AR: s1 in slot 0 for 10 steps, s2 in slot 1 for 3, s3 in slot 1 steps 3..5:
    # 5 steps with 2 active (0..4), 5 steps with 1 active (5..9).
    assert res.ar_ms == pytest.approx(5 * Linear().step_cost(1, 2) + 5 * Linear().step_cost(1, 1))
    # Full-batch steps t0..t2 commit 6 + 6 + 2 tokens; AR at a full batch: 2 per L(1, 2).
    full_ms = 2 * Linear().step_cost(3, 2) + Linear().step_cost(1.5, 2)
    assert res.full_batch_tokens == 14
    assert res.speedup_full_batch == pytest.approx((14 / full_ms) / (2 / Linear().step_cost(1, 2)))
    rows = res.recorder.rows()
    assert [(r["session"], r["batch_step"], r["num_active"]) for r in rows] == [
        ("s1", 0, 2), ("s2", 0, 2), ("s1", 1, 2), ("s2", 1, 2),
        ("s3", 2, 2), ("s2", 2, 2), ("s3", 3, 1),
    ]  # fmt: skip
    res_max = replay_batched(
        [(s, server) for s in sessions], batch_size=2, cost_model=Linear(), batch_cost="max"
    )
    expected_max = (
        2 * Linear().step_cost(5, 2) + Linear().step_cost(2, 2) + Linear().step_cost(2, 1)
    )
    assert res_max.spec_ms == pytest.approx(expected_max)


def test_ar_cost_matches_simulated_null_drafter() -> None:
    lengths = [5, 0, 3, 9, 1, 4, 4]
    sessions = [
        ReplaySession(f"s{i}", (_call("a", 0, list(range(n))),)) for i, n in enumerate(lengths)
    ]
    for b in (1, 2, 3, 8):
        res = replay_batched(
            [(s, FixedServer()) for s in sessions], batch_size=b, cost_model=Linear()
        )
        cost, steps = ar_time_ms(lengths, batch_size=b, timer=StepTimer(Linear()))
        assert res.spec_ms == pytest.approx(cost)
        assert res.num_batch_steps == steps


def test_drafting_time_is_counted_and_bad_input_rejected() -> None:
    session = ReplaySession("s", (_call("a", 0, [1, 2, 3]),))
    res = replay_batched(
        [(session, FixedServer())], batch_size=1, cost_model=Flat(), decode_step_ms=10.0
    )
    assert res.draft_ns > 0
    assert res.speedup_with_drafting < res.speedup
    with pytest.raises(ValueError, match="batch_size"):
        replay_batched([(session, FixedServer())], batch_size=0, cost_model=Flat())
    with pytest.raises(ValueError, match="batch_cost"):
        replay_batched([(session, FixedServer())], batch_size=1, cost_model=Flat(), batch_cost="x")

    class Greedy(FixedServer):
        def session(self, session_id, *, emission_format="none"):
            s = FixedSession(self, session_id)
            s.call = lambda *a: FixedDrafter([], [[1, 2, 3, 4, 5]] * 9)  # ignores max_tokens
            d = s.call()
            d.propose = lambda k: [1] * (k + 1)
            s.call = lambda *a: d
            return s

    with pytest.raises(ValueError, match="more than"):
        replay_batched([(session, Greedy())], batch_size=1, cost_model=Flat(), max_draft_tokens=2)


class TreeDrafter(FixedDrafter):
    """Proposes `proposals[i]` (tokens, parents) as a tree at step i."""

    def propose_tree(self, max_nodes):
        from agspec.drafter.tree import DraftTree

        p = self.proposals[self.step] if self.step < len(self.proposals) else [[], []]
        tree = DraftTree(p[0], p[1], check=False)  # as a careless custom drafter might
        return tree


class TreeServer(FixedServer):
    def session(self, session_id, *, emission_format="none"):
        server = self

        class _S(FixedSession):
            def call(self, agent, role, turn):
                return TreeDrafter(server.log, server.plan.get((session_id, agent, turn), []))

        return _S(self, session_id)


def test_trees_are_verified_along_the_longest_path_and_priced_by_nodes():
    # Output 8 9 12 13. Step 1: tree 8 -> 10, 8 -> 9 -> 12: the second branch wins,
    # accept 3 (8 9 12) + bonus 13: one step. The first branch (8 10) had 1.
    sess = ReplaySession("s", (_call("a", 0, [8, 9, 12, 13]),))
    plan = {("s", "a", 0): [[[8, 10, 9, 12], [-1, 0, 0, 2]]]}
    res = replay_batched([(sess, TreeServer(plan))], batch_size=1, cost_model=Flat())
    assert res.num_steps == 1 and res.num_output_tokens == 4
    assert res.num_drafted_tokens == 4 and res.drafted_per_step == 4.0
    assert res.num_accepted_tokens == 3
    assert res.recorder.columns["first_branch_accepted"] == [1]
    assert res.num_branch_wins == 1 and res.branch_win_share == 1.0
    summary = res.summary()
    assert summary["first_branch_accept_length"] == 1.0 and summary["num_branch_wins"] == 1


def test_tree_nodes_count_in_the_batch_cost():
    # One request, Linear cost: a 4-node tree costs 1 + 0.1 * 4 like a 4-token chain.
    sess = ReplaySession("s", (_call("a", 0, [8, 9, 12, 13]),))
    plan = {("s", "a", 0): [[[8, 10, 9, 12], [-1, 0, 0, 2]]]}
    res = replay_batched([(sess, TreeServer(plan))], batch_size=1, cost_model=Linear())
    assert res.spec_ms == pytest.approx(1.0 + 0.1 * 4)


@pytest.mark.parametrize(
    "tokens, parents, needle",
    [([8, 9], [-1, 1], r"parents\[1\] = 1"), ([8, 9], [-1, 3], r"parents\[1\] = 3")],
)
def test_a_malformed_tree_is_refused_before_verification(tokens, parents, needle):
    sess = ReplaySession("s", (_call("a", 0, [8, 9]),))
    server = TreeServer({("s", "a", 0): [[tokens, parents]]})
    with pytest.raises(ValueError, match="drafter 'fixed'.s tree.*" + needle):
        replay_batched([(sess, server)], batch_size=1, cost_model=Flat())
    # Nothing was accepted: the error came before verification.
    assert not [e for e in server.log if e[0] == "accept"]
