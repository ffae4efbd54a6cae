"""`step_batch` against its oracle, every call's `accept` and then every call's `propose`
one at a time: the same drafts, sources and match lengths, and the same policy state
afterwards (acceptance counts, running batch means, scales), float for float, whatever
the mix of servers, engines, committed-token types and per-request draft bounds."""

from __future__ import annotations

import random

import numpy as np
import pytest
from chartok import CharTokenizer

from agspec import _native
from agspec.drafter import VARIANTS, AgSpecServer, step_batch
from agspec.drafter.call import AgSpecCall
from agspec.drafter.protocol import greedy_commit
from agspec.policy.costmodel import get_cost_model

COST_MODEL = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)


def make_server(variant: str, batch_size: int, **overrides: object) -> AgSpecServer:
    from dataclasses import replace

    return AgSpecServer(
        tokenizer=CharTokenizer(),
        config=replace(VARIANTS[variant], **overrides),
        cost_model=COST_MODEL,
        batch_size=batch_size,
    )


def policy_state(server: AgSpecServer) -> tuple[object, ...]:
    p = server.lengths
    return (
        p.survival.counts,
        p.survival.version,
        p.mean_draft,
        p.mean_committed,
        dict(p.scale.scales) if p.scale is not None else None,
    )


def texts_for(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    words = [[rng.randrange(1, 40) for _ in range(rng.randrange(2, 6))] for _ in range(30)]
    return [[t for _ in range(50) for t in rng.choice(words)] for _ in range(n)]


def by_phases(calls: list[AgSpecCall], committed: list[object], caps: list[int]) -> list[list[int]]:
    """The step as `step_batch` documents its phases, one call at a time in each, through
    the call's public batch interface: check and learn from every call's tokens
    (`accept_fed`), move every corpus, count them against the live token budget
    (`count_committed`, which may stop indexing or evict sessions), then propose."""
    applied, moved = [], []
    for call, c in zip(calls, committed):
        if c is not None and len(c):  # type: ignore[arg-type]
            moved.append(call.accept_fed(c))  # type: ignore[arg-type]
            applied.append(call)
        elif not call.live:
            raise call.not_live_error("step_batch()")
    for call, toks in zip(applied, moved):
        assert call.corpora is not None
        call.corpora.advance(toks)
    for call, toks in zip(applied, moved):
        call.count_committed(len(toks))
    for call in calls:
        if not call.live:
            raise call.not_live_error("step_batch()")
    return [call.propose(k) for call, k in zip(calls, caps)]


def one_at_a_time(
    calls: list[AgSpecCall], committed: list[object], caps: list[int]
) -> list[list[int]]:
    """`step_batch`'s documented equivalent: every call accepts, then every call proposes."""
    for call, c in zip(calls, committed):
        if c is not None:
            call.accept(c)  # type: ignore[arg-type]
    return [call.propose(k) for call, k in zip(calls, caps)]


def run_both(
    variant: str,
    *,
    num_requests: int,
    num_servers: int = 1,
    batch_size: int = 8,
    seed: int = 0,
    numpy_every: int = 0,
    oracle=one_at_a_time,  # type: ignore[no-untyped-def]
    **overrides: object,
) -> tuple[list[AgSpecServer], list[AgSpecServer], int]:
    """Replays `num_requests` requests (spread over sessions and servers) greedily, once
    with `step_batch` and once with `oracle`; asserts every step alike (drafts, or the
    error raised). Returns the two worlds' servers and the number of tokens drafted."""
    rng = random.Random(seed + 1)
    texts = texts_for(seed, num_requests)
    worlds = []
    for _ in range(2):
        servers = [make_server(variant, batch_size, **overrides) for _ in range(num_servers)]
        calls = []
        for i, text in enumerate(texts):
            server = servers[i % num_servers]
            call = server.session(f"s{i % 3}").call("coder" if i % 2 else "tester", "code", 1)
            call.begin([0, *text[:40]])
            calls.append(call)
        worlds.append((servers, calls))
    (servers_b, calls_b), (servers_1, calls_1) = worlds
    pos = [40] * num_requests
    committed: list[list[int] | None] = [None] * num_requests
    drafted = 0
    step = 0
    while True:
        active = [i for i, (p, t) in enumerate(zip(pos, texts)) if p < len(t)]
        if not active:
            break
        step += 1
        # Per-request bounds, some 0 (no draft this step).
        caps = [rng.choice([0, 3, 16, 16, 16]) for _ in active]
        given: list[object] = []
        for i in active:
            c = committed[i]
            if c is not None and numpy_every and (i + step) % numpy_every == 0:
                # Not a list: converted as `accept` converts it.
                given.append(np.asarray(c, dtype=np.int32) if step % 2 else tuple(c))
            else:
                given.append(c)
        try:
            expected = oracle([calls_1[i] for i in active], given, caps)
        except (KeyError, RuntimeError) as exc:
            expected_error = repr(exc)
        else:
            expected_error = ""
        try:
            got = step_batch([calls_b[i] for i in active], given, caps)  # type: ignore[arg-type]
        except (KeyError, RuntimeError) as exc:
            assert repr(exc) == expected_error
            break
        assert not expected_error and got == expected
        for i in active:
            assert (calls_b[i].last_source, calls_b[i].last_match_length) == (
                calls_1[i].last_source,
                calls_1[i].last_match_length,
            )
        for i, draft in zip(active, got):
            _, commit = greedy_commit(draft, texts[i], pos[i])
            committed[i] = commit
            pos[i] += len(commit)
            drafted += len(draft)
    for a, b in zip(servers_b, servers_1):
        assert policy_state(a) == policy_state(b)
        # The live token count (counted during the advance when the step stays within the
        # budget, after it when it may not) and each session's share of it.
        assert a.live_tokens == b.live_tokens
        assert {k: s.counted_tokens for k, s in a.sessions.items()} == {
            k: s.counted_tokens for k, s in b.sessions.items()
        }
    return servers_b, servers_1, drafted


@pytest.mark.parametrize(
    "variant",
    [
        "agspec",
        "agspec-paper",
        "agspec-paper-cap",
        "agspec-paper-static",
        "agspec-paper-match",
        "agspec-paper-request-only",
        "agspec-paper-on-suffix-tree",  # not native: per-call continuations, engine bounds
        "agspec-paper+gate8",
    ],
)
@pytest.mark.parametrize("batch_size", [1, 8])
def test_step_batch_is_accept_then_propose_one_call_at_a_time(variant, batch_size):
    _, _, drafted = run_both(variant, num_requests=7, batch_size=batch_size, numpy_every=3)
    assert drafted > 0


@pytest.mark.parametrize("variant", ["agspec", "agspec-paper", "agspec-frequent"])
def test_a_large_batch_on_helper_threads_is_accept_then_propose(variant):
    """40 requests of three sessions, past the size from which the native batched calls
    hand their work to helper threads (cpp/index/workers.h): still the oracle's drafts,
    sources and policy state, with the appends to one session from many threads' sets."""
    _native.set_batch_threads(4)
    try:
        _, _, drafted = run_both(variant, num_requests=40, batch_size=64, seed=3)
    finally:
        _native.set_batch_threads(0)
    assert drafted > 0


def test_a_forked_child_steps_large_batches_on_its_own_helpers():
    """The helper threads do not survive fork(): a child of a process whose batches used
    them (the replay lab's workers fork) steps large batches too, with the oracle's drafts
    and without hanging. (What can hang without the fork handler, a helper inside a call
    at the fork, is a race this test cannot force.)"""
    import os
    import signal

    _native.set_batch_threads(2)
    try:
        run_both("agspec", num_requests=20, batch_size=64, seed=4)  # the parent's helpers start
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            signal.alarm(60)  # a deadlock fails the test instead of hanging it
            try:
                _, _, drafted = run_both("agspec", num_requests=20, batch_size=64, seed=5)
                os._exit(0 if drafted > 0 else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        _native.set_batch_threads(0)


def test_calls_of_several_servers_in_one_step():
    servers, _, drafted = run_both("agspec", num_requests=8, num_servers=2, seed=3)
    assert drafted > 0
    # Both servers learned (each from its own requests only).
    assert all(s.lengths.survival.version > 0 for s in servers)


@pytest.mark.parametrize("budget", [300, 800])
def test_a_live_token_budget_crossed_inside_a_step(budget):
    # The step's tokens go over the budget: sessions are evicted (their calls refused,
    # the next step raises) and a session alone over it stops indexing, at the same call.
    servers, _, drafted = run_both(
        "agspec", num_requests=6, seed=5, live_token_budget=budget, oracle=by_phases
    )
    assert drafted > 0
    assert len(servers[0].sessions) < 3  # one was evicted
    assert servers[0].live_tokens <= budget


def test_one_session_alone_over_the_budget_stops_indexing_inside_a_step():
    server = make_server("agspec", 8, live_token_budget=60)
    twin = make_server("agspec", 8, live_token_budget=60)
    worlds = []
    for srv in (server, twin):
        calls = []
        for _ in range(3):
            c = srv.session("s0").call("coder", "code", 1)
            c.begin([0, 1, 2, 3])
            calls.append(c)
        worlds.append(calls)
    calls_b, calls_1 = worlds
    committed: list[object] = [None] * 3
    for step in range(30):
        expected = by_phases(calls_1, committed, [8, 8, 8])
        assert step_batch(calls_b, committed, 8) == expected  # type: ignore[arg-type]
        committed = [[*d[:1], 5 + (step + i) % 7] for i, d in enumerate(expected)]
    assert server.sessions["s0"].frozen and twin.sessions["s0"].frozen
    assert server.live_tokens == twin.live_tokens
    assert policy_state(server) == policy_state(twin)


def test_the_cost_rule_at_batch_size_above_one_sees_the_whole_step():
    servers, _, _ = run_both("agspec", num_requests=9, batch_size=64, seed=2)
    p = servers[0].lengths
    assert servers[0].batch_cost_mode and p.mean_draft > 0.0


def _calls(server: AgSpecServer, n: int) -> list[AgSpecCall]:
    calls = []
    for i in range(n):
        c = server.session(f"s{i}").call("coder", "code", 1)
        c.begin([0, *([1, 2, 3, 4, 5, 6, 7, 8] * 6)])
        calls.append(c)
    return calls


@pytest.mark.parametrize("variant", ["agspec", "agspec-paper"])
def test_a_refused_call_leaves_the_policy_fed_by_the_calls_before_it(variant):
    """Bad committed tokens at call 1 of 3 raise; the policy learned from call 0 (as if
    it had accepted alone) and from nothing else; the refused call keeps its draft."""
    batch, alone = make_server(variant, 8), make_server(variant, 8)
    calls_b, calls_1 = _calls(batch, 3), _calls(alone, 3)
    drafts = step_batch(calls_b, [None] * 3, 8)
    assert drafts == [c.propose(8) for c in calls_1] and drafts[0]
    with pytest.raises(ValueError, match="never proposed"):
        step_batch(calls_b, [drafts[0][:2], [99, 99, 99], [1]], 8)
    calls_1[0].accept(drafts[0][:2])
    assert policy_state(batch) == policy_state(alone)
    assert calls_b[1].draft == drafts[1]  # untouched: it can still accept
    calls_b[1].accept(drafts[1][:1])
    calls_1[1].accept(drafts[1][:1])
    assert policy_state(batch) == policy_state(alone)


def test_refusals_keep_their_messages():
    server = make_server("agspec", 8)
    calls = _calls(server, 2)
    step_batch(calls, [None, None], 4)
    with pytest.raises(TypeError, match=r"committed_ids\[-1\] must be an int"):
        step_batch(calls, [[1], [True]], 4)
    with pytest.raises(ValueError, match="outside"):
        step_batch(calls, [[1], [-3]], 4)
    with pytest.raises(ValueError, match="never proposed"):
        step_batch(calls, [[1], np.arange(1, 12, dtype=np.int32)], 4)
    calls[1].end()
    with pytest.raises(RuntimeError, match="begin"):
        step_batch(calls, [[1], [1]], 4)
