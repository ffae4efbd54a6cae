"""Ended and evicted sessions stop their calls and free their memory; the live-token
budget bounds live memory; AgSpecConfig refuses values that cannot work (issue 12)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from chartok import CharTokenizer, toks

from agspec.drafter import AgSpecConfig, AgSpecServer


def _server(**config: object) -> AgSpecServer:
    return AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False, **config))  # type: ignore[arg-type]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_calls_of_an_ended_session_raise_key_error() -> None:
    server = _server()
    sess = server.session("s")
    call = sess.call("coder")
    call.begin(toks("\x00abcabcab"))
    assert call.propose(4)  # the session drafts while it lives
    sess.end()
    with pytest.raises(KeyError, match="ended or evicted"):
        call.propose(4)
    with pytest.raises(KeyError, match="ended or evicted"):
        call.accept(toks("c"))
    call.end()  # ending a stopped call is allowed (callers end calls in `finally`)
    unbegun = server.session("t").call("coder")
    server.session("t").end()
    with pytest.raises(KeyError):
        unbegun.begin(toks("\x00ab"))


def test_calls_of_an_evicted_session_raise_key_error_and_do_not_end_its_successor() -> None:
    now = [0.0]
    server = AgSpecServer(
        tokenizer=CharTokenizer(),
        config=AgSpecConfig(use_global=False, session_ttl_s=10.0),
        clock=lambda: now[0],
    )
    old = server.session("s")
    call = old.call("coder")
    call.begin(toks("\x00abcabcab"))
    now[0] = 100.0
    server.session("other")  # a new session evicts the idle one
    with pytest.raises(KeyError):
        call.propose(4)
    new = server.session("s")  # the same id again: a new session
    old.end()  # the evicted object's end() must not end its successor
    assert server.get_session("s") is new
    new.call("coder").begin(toks("\x00xy"))


def test_kept_call_objects_of_ended_sessions_hold_no_corpus_memory() -> None:
    # Each session indexes 2,000 random tokens (~190 kB of index); a caller keeps the last
    # call object of every session. Before the fix, 1,000 sessions kept ~190 MB alive.
    rng = np.random.default_rng(0)
    server = _server()
    kept = []

    def one(i: int) -> None:
        sess = server.session(f"s{i}")
        call = sess.call("coder")
        call.begin(rng.integers(1, 50_000, 2_000).tolist())
        call.propose(8)
        call.accept([7])
        sess.end()
        kept.append(call)

    for i in range(50):  # warm up the allocator
        one(i)
    before = _rss_bytes()
    for i in range(50, 1_050):
        one(i)
    grown = _rss_bytes() - before
    assert grown < 40 * 2**20, f"RSS grew {grown / 2**20:.0f} MB over 1,000 ended sessions"
    assert server.live_tokens == 0
    assert all(c.session.num_tokens == 0 for c in kept)


def test_one_growing_session_stays_within_the_live_token_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = 20_000
    server = _server(live_token_budget=budget)
    rng = np.random.default_rng(1)
    idle = server.session("idle")
    idle.call("coder").begin([0, *rng.integers(1, 50_000, 3_000).tolist()])
    sess = server.session("big")
    caplog.set_level(logging.WARNING, logger="agspec.drafter")
    step = 500
    for _ in range(100):  # 100 calls x (500 prompt + 500 output tokens): 5x the budget
        call = sess.call("coder")
        call.begin([0, *rng.integers(1, 50_000, step).tolist()])
        for tok in rng.integers(1, 50_000, step).tolist():
            call.accept([*call.propose(4), tok])
        call.end()
        assert server.live_tokens <= budget + step + 1
        assert sess.session_corpus.num_tokens <= budget + step + 1
    # The idle session went first (least recently used), then the big one stopped indexing.
    with pytest.raises(KeyError):
        server.get_session("idle")
    assert sess.frozen
    warnings = [r for r in caplog.records if "live token budget" in r.getMessage()]
    assert len(warnings) == 1
    # It still drafts from what it holds.
    held = sess.session_corpus.index.document(1)
    call = sess.call("coder")
    call.begin([0, *held[:40]])
    assert call.propose(8) == held[40:48]


def test_growth_evicts_least_recently_used_sessions_first() -> None:
    server = _server(live_token_budget=10_000)
    for name in ("a", "b", "c"):
        server.session(name).call("coder").begin(
            [0, *range(1000 * ord(name), 1000 * ord(name) + 3000)]
        )
    server.session("a")  # touch: b is now the least recently used
    call = server.session("c").call("coder")
    call.begin([0, *range(200_000, 203_000)])  # c: 6,000 tokens, total 12,000
    with pytest.raises(KeyError):
        server.get_session("b")
    assert server.get_session("a") and server.live_tokens <= 10_000


@pytest.mark.parametrize(
    "field, value",
    [
        ("live_token_budget", -5),
        ("live_token_budget", 0),
        ("history_budget_tokens", -1),
        ("session_ttl_s", float("nan")),
        ("session_ttl_s", float("inf")),
        ("session_ttl_s", -1.0),
        ("session_ttl_s", 0.0),
        ("scale_step", float("nan")),
        ("scale_min", -0.1),
        ("scale_max", 0.5),
        ("scale_max", float("inf")),
        ("cost_prior_weight", float("inf")),
        ("break_even_prob", float("nan")),
        ("max_match_tokens", 1.5),
        ("max_match_tokens", True),
        ("global_margin_tokens", 0.5),
        ("use_global", 1),
        ("session_rule", "newest"),
        ("memory_budget_bytes", 4096),
        ("memory_budget_bytes", -1),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AgSpecConfig(**{field: value})  # type: ignore[arg-type]


def test_config_accepts_its_defaults_and_ints_for_floats() -> None:
    cfg = AgSpecConfig(session_ttl_s=10, scale_max=4)
    assert cfg.session_ttl_s == 10 and math.isfinite(cfg.scale_step)


@pytest.mark.parametrize(
    "step,error,message",
    [
        (lambda s, c: c.propose("8"), TypeError,
         r"max_tokens must be an int in \[0, 65536\], got str"),
        (lambda s, c: c.propose(None), TypeError, "max_tokens must be an int.*got NoneType"),
        (lambda s, c: c.propose(2.5), TypeError, "max_tokens must be an int.*got float"),
        (lambda s, c: c.propose(True), TypeError, "max_tokens must be an int.*got bool"),
        (lambda s, c: c.propose(-1), ValueError, r"max_tokens must be in \[0, 65536\], got -1"),
        (lambda s, c: c.accept(None), TypeError,
         "committed_ids must be a sequence of int token ids, got NoneType"),
        (lambda s, c: s.call(None), ValueError, "agent must be a non-empty str, got NoneType"),
        (lambda s, c: s.call("a", 3), TypeError, "role must be a str, got int"),
        (lambda s, c: s.call("a", "code", "x"), ValueError, "turn must be an int >= 0, got str"),
        (lambda s, c: s.call("a", "code", -2), ValueError, "turn must be an int >= 0, got -2"),
        (lambda s, c: s.server.session(5), ValueError,
         "session_id must be a non-empty str, got int"),
    ],
    ids=["propose-str", "propose-none", "propose-float", "propose-bool", "propose-negative",
         "accept-none", "agent-none", "role-int", "turn-str", "turn-negative", "session-int"],
)  # fmt: skip
def test_refusals_name_the_argument_its_type_and_the_accepted_range(step, error, message) -> None:
    srv = AgSpecServer(tokenizer=CharTokenizer())
    s = srv.session("s")
    c = s.call("a", "code", 0)
    c.begin(toks("abcabc"))
    with pytest.raises(error, match=message):
        step(s, c)
    # The refusal changed nothing: the call still drafts and commits.
    draft = c.propose(4)
    c.accept(draft[:1] or toks("a"))


def _fill(server: AgSpecServer, rng: np.random.Generator, sessions: int) -> int:
    """`sessions` sessions of one call each (code-like prompt, 200 steps of output);
    the peak of the server's measured corpus bytes, taken after every call's start."""
    words = rng.integers(1, 400, 60).tolist()  # a small vocabulary repeats, as code does
    peak = 0
    for i in range(sessions):
        call = server.session(f"s{i}").call("coder")
        call.begin([0, *rng.choice(words, 3000).tolist()])
        peak = max(peak, server.memory_bytes())
        for tok in rng.integers(1, 400, 200).tolist():
            call.accept([*call.propose(4)[:2], tok])
        call.end()
        peak = max(peak, server.memory_bytes())
    return peak


def test_the_memory_budget_bounds_the_measured_corpora_and_drafting_goes_on() -> None:
    budget = 4 << 20
    unbounded = _fill(_server(use_history=True), np.random.default_rng(3), 40)
    assert unbounded > 3 * budget  # the workload needs far more than the budget
    server = _server(use_history=True, memory_budget_bytes=budget)
    peak = _fill(server, np.random.default_rng(3), 40)
    # At most one call's growth past the last fit (a call's start measures again).
    assert peak <= 1.1 * budget, (peak, budget)
    assert server.live_token_budget < AgSpecConfig().live_token_budget
    assert server.history_budget_tokens <= server.live_token_budget
    # The newest session is kept and still drafts from what it holds.
    newest = server.get_session("s39")
    held = newest.session_corpus.index.document(1)
    call = newest.call("coder")
    call.begin([0, *held[:40]])
    assert call.propose(8) == held[40:48]
