"""The oracle bound and its suffix automaton against brute force."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.lab.oracle import OracleServer, SuffixAutomaton
from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.simulator import replay_batched


class Flat:
    def step_cost(self, n_tokens, batch_size):
        return 1.0


def _occurs(needle, docs) -> bool:
    n = len(needle)
    return any(
        list(doc[i : i + n]) == list(needle) for doc in docs for i in range(len(doc) - n + 1)
    )


def _brute_longest(seq, start, cap, docs) -> int:
    best = 0
    for n in range(1, min(cap, len(seq) - start) + 1):
        if _occurs(seq[start : start + n], docs):
            best = n
    return best


docs_strategy = st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=4)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, query=st.lists(st.integers(0, 3), max_size=10))
def test_automaton_longest_prefix_matches_brute_force(docs, query) -> None:
    sam = SuffixAutomaton()
    for doc in docs:
        sam.add_document(doc)
    for start in range(len(query)):
        assert sam.longest_prefix(query, 6, start) == _brute_longest(query, start, 6, docs)


@settings(max_examples=100, deadline=None)
@given(
    base=st.lists(st.integers(0, 3), max_size=10),
    tails=st.lists(
        st.tuples(st.integers(0, 10), st.lists(st.integers(0, 3), max_size=6)), max_size=4
    ),
    query=st.lists(st.integers(0, 3), max_size=8),
)
def test_automaton_resumed_documents_match_brute_force(base, tails, query) -> None:
    # Documents that share a prefix with an earlier one resume from its states.
    sam = SuffixAutomaton()
    states = sam.add_document(base)
    docs = [base]
    for cut, tail in tails:
        cut = min(cut, len(base))
        start = states[cut - 1] if cut else 0
        sam.add_document(tail, start_state=start)
        docs.append(base[:cut] + tail)
    for start in range(len(query)):
        assert sam.longest_prefix(query, 8, start) == _brute_longest(query, start, 8, docs)


def test_oracle_worked_example() -> None:
    session = ReplaySession("s", (ReplayCall("a", "r", 0, [1, 2, 3, 4], [2, 3, 9, 2, 3, 9]),))
    server = OracleServer({"s": [[2, 3, 9, 2, 3, 9]]}, cap_tokens=8)
    res = replay_batched([(session, server)], batch_size=1, cost_model=Flat())
    rows = res.recorder.rows()
    assert [(r["drafted"], r["accepted"], r["committed"]) for r in rows] == [(2, 2, 3), (3, 3, 3)]


def _brute_oracle_steps(calls, scope, cap, global_docs, earlier_run_docs):
    """Steps of the oracle by brute force: list of (drafted, committed) per step."""
    steps = []
    session_docs: list[list[int]] = []
    for prompt, out in calls:
        pos = 0
        while pos < len(out):
            current = list(prompt) + list(out[:pos])
            docs = [current] + list(global_docs)
            if scope in ("session", "run"):
                docs += session_docs
            if scope == "run":
                docs += earlier_run_docs
            n = _brute_longest(out, pos, cap, docs)
            committed = n if n == len(out) - pos else n + 1
            steps.append((n, committed))
            pos += committed
        session_docs.append(list(prompt) + list(out))
    return steps, session_docs


@pytest.mark.parametrize("scope", ["call", "session", "run"])
def test_oracle_replay_matches_brute_force(scope) -> None:
    rng = random.Random(7)
    sessions = []
    for s in range(3):
        calls = []
        history: list[int] = [rng.randrange(5) for _ in range(6)]
        for c in range(3):
            out = [rng.randrange(5) for _ in range(rng.randrange(0, 14))]
            # Half the prompts extend the history (as agent prompts do), half are fresh.
            prompt = history[:] if c % 2 == 0 else [rng.randrange(5) for _ in range(5)]
            calls.append((prompt, out))
            history = prompt + out + [rng.randrange(5)]
        sessions.append((f"s{s}", calls))
    global_docs = [[rng.randrange(5) for _ in range(8)] for _ in range(2)]
    cap = 5
    server = OracleServer(
        {sid: [out for _, out in calls] for sid, calls in sessions},
        global_docs=global_docs,
        cap_tokens=cap,
        scope=scope,
    )
    replay = [
        (
            ReplaySession(
                sid, tuple(ReplayCall("a", "r", i, p, o) for i, (p, o) in enumerate(calls))
            ),
            server,
        )
        for sid, calls in sessions
    ]
    res = replay_batched(replay, batch_size=1, cost_model=Flat(), max_draft_tokens=64)
    got = [(r["drafted"], r["committed"]) for r in res.recorder.rows()]
    expected = []
    run_docs: list[list[int]] = []
    for _, calls in sessions:
        steps, docs = _brute_oracle_steps(calls, scope, cap, global_docs, run_docs)
        expected += steps
        run_docs += docs
    assert got == expected


def test_oracle_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="scope"):
        OracleServer({}, scope="galaxy")
    with pytest.raises(KeyError, match="no recorded outputs"):
        OracleServer({}).session("nope")


def test_tree_bound_needs_the_contexts_last_token_before_the_copy():
    # Text 1 2 3 4 (the prompt). Output 2 3 9: the oracle copies 2 3 from anywhere; the
    # tree bound only after an occurrence of the context's last token.
    from agspec.lab.oracle import OracleServer

    for last, bound in ((1, 2), (3, 0)):
        outputs = {"s": [[2, 3, 9]]}
        chain = OracleServer(outputs).session("s").call("a", "r", 0)
        tree = OracleServer(outputs, anchored=True).session("s").call("a", "r", 0)
        for call in (chain, tree):
            call.begin([1, 2, 3, 4, 7, last])
        assert chain.propose(8) == [2, 3]
        assert tree.propose(8) == [2, 3][:bound]
