"""Session inference against a brute-force oracle: the longest earlier boundary that prefixes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.drafter.session_inference import SessionResolver, agent_name, message_unit


def msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def test_conversation_continues_and_tasks_sharing_a_system_prompt_stay_apart() -> None:
    r = SessionResolver()
    system = msg("system", "You are a helpful assistant that can run bash.")
    a1 = [system, msg("user", "Fix bug A")]
    b1 = [system, msg("user", "Fix bug B")]
    ra = r.resolve_messages(a1)
    r.record_messages(ra, a1, msg("assistant", "ls -la"))
    rb = r.resolve_messages(b1)
    assert rb.is_new and rb.session_id != ra.session_id  # same system prompt, other task
    r.record_messages(rb, b1, msg("assistant", "cat b.py"))
    a2 = a1 + [msg("assistant", "ls -la"), msg("user", "a.py b.py")]
    ra2 = r.resolve_messages(a2)
    assert (ra2.session_id, ra2.is_new, ra2.num_known_units) == (ra.session_id, False, 3)
    # The client changed the answer (e.g. stripped a thought): the request boundary still holds.
    a2b = a1 + [msg("assistant", "something else"), msg("user", "a.py")]
    ra2b = r.resolve_messages(a2b)
    assert (ra2b.session_id, ra2b.num_known_units) == (ra.session_id, 2)
    # Whitespace around the answer and tool-call ids do not matter.
    assert message_unit(msg("assistant", " ls -la\n")) == message_unit(msg("assistant", "ls -la"))
    call = {"id": "x1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    other = {"id": "y2", "function": {"name": "bash", "arguments": "{}"}}
    base = {"role": "assistant", "content": None}
    assert message_unit({**base, "tool_calls": [call]}) == message_unit(
        {**base, "tool_calls": [other]}
    )


def test_explicit_ids_win_and_count_only_their_own_boundaries() -> None:
    r = SessionResolver()
    m = [msg("user", "hello")]
    res = r.resolve_messages(m, explicit="s1")
    assert (res.session_id, res.is_new, res.explicit) == ("s1", True, True)
    r.record_messages(res, m, msg("assistant", "hi"))
    m2 = m + [msg("assistant", "hi"), msg("user", "again")]
    assert r.resolve_messages(m2, explicit="s1").num_known_units == 2
    other = r.resolve_messages(m2, explicit="s2")
    assert (other.session_id, other.num_known_units, other.is_new) == ("s2", 0, True)
    assert r.resolve_messages(m2).session_id == "s1"  # automatic: continues s1
    with pytest.raises(ValueError, match="non-empty"):
        r.resolve_messages(m, explicit="")


def test_ttl_and_max_sessions_expire_and_notify() -> None:
    now = [0.0]
    r = SessionResolver(ttl_s=10.0, max_sessions=2, clock=lambda: now[0])
    gone: list[str] = []
    r.on_expire = gone.append
    ids = []
    for i in range(3):
        m = [msg("user", f"task {i}")]
        res = r.resolve_messages(m)
        r.record_messages(res, m, msg("assistant", "ok"))
        ids.append(res.session_id)
    assert gone == [ids[0]] and len(r) == 2  # the least recently used one
    now[0] = 100.0
    fresh = r.resolve_messages([msg("user", "task 2")])
    assert fresh.is_new and set(gone) == set(ids)  # idle past the TTL: forgotten
    assert r.num_boundaries() == 0
    with pytest.raises(ValueError):
        SessionResolver(ttl_s=float("nan"))
    with pytest.raises(TypeError):
        SessionResolver(max_sessions=True)


def test_bad_input_is_a_clear_error() -> None:
    r = SessionResolver()
    with pytest.raises(TypeError, match="list of message"):
        r.resolve_messages("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"messages\[1\]"):
        r.resolve_messages([msg("user", "a"), 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="non-negative"):
        r.resolve_tokens([1, -2])
    with pytest.raises(TypeError, match="integers"):
        r.resolve_tokens(np.array([1.5]))
    assert r.resolve_tokens([]).is_new


def test_agent_name_is_stable() -> None:
    assert agent_name("You are\n a coder") == agent_name("You are a coder")
    assert agent_name("You are a coder") != agent_name("You are a reviewer")
    assert agent_name("") == "agent-default"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=0, max_size=12),  # prompt
            st.lists(st.integers(0, 3), min_size=0, max_size=4),  # output
        ),
        min_size=1,
        max_size=12,
    )
)
def test_tokens_match_a_brute_force_oracle(requests: list[tuple[list[int], list[int]]]) -> None:
    """Each request resolves to the owner of the longest recorded boundary that prefixes it."""
    r = SessionResolver()
    boundaries: dict[tuple[int, ...], str] = {}  # the oracle: boundary -> latest owner
    for prompt, output in requests:
        res = r.resolve_tokens(prompt)
        hits = [b for b in boundaries if len(b) <= len(prompt) and tuple(prompt[: len(b)]) == b]
        if hits:
            best = max(hits, key=len)
            assert (res.session_id, res.num_known_units, res.is_new) == (
                boundaries[best],
                len(best),
                False,
            )
        else:
            assert res.is_new and res.num_known_units == 0
        r.record_tokens(res, prompt, output)
        for b in (tuple(prompt), tuple(prompt + output)):
            if b:
                boundaries[b] = res.session_id


def test_long_prompts_resolve_in_one_pass_and_threads_agree() -> None:
    rng = np.random.default_rng(0)
    r = SessionResolver()
    prompt = rng.integers(0, 150_000, 30_000)
    res = r.resolve_tokens(prompt)
    out = rng.integers(0, 150_000, 200)
    r.record_tokens(res, prompt, out)
    nxt = np.concatenate([prompt, out, rng.integers(0, 150_000, 500)])
    assert r.resolve_tokens(nxt).num_known_units == 30_200
    results: list[str] = []

    def worker() -> None:
        for _ in range(50):
            results.append(r.resolve_tokens(nxt).session_id)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {res.session_id}


# --- client ids (session and agent ids a client sends) ---------------------------------

_SAFE_HEADER = __import__("re").compile(r"[A-Za-z0-9._:@+=-]{1,128}")


@given(st.text(max_size=300))
@settings(max_examples=400, deadline=None)
def test_client_id_is_safe_or_refused_with_the_rule(raw: str) -> None:
    from agspec.drafter.session_inference import MAX_CLIENT_ID_CHARS, client_id

    bad = (
        not raw
        or len(raw) > MAX_CLIENT_ID_CHARS
        or any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) <= 0xDFFF for c in raw)
    )
    if bad:
        with pytest.raises(ValueError, match="session id: "):
            client_id(raw)
        return
    out = client_id(raw)
    assert _SAFE_HEADER.fullmatch(out), out  # fits a header, a log line, a file name
    assert client_id(raw) == out  # stable: the client's next request finds its session
    assert out == raw or out.startswith("h-")


def test_client_id_keeps_safe_ids_and_maps_the_rest() -> None:
    from agspec.drafter.session_inference import client_id

    assert client_id("mini-swe:task_12@run.3") == "mini-swe:task_12@run.3"
    assert client_id("ünïcode").startswith("h-") and client_id("日本") != client_id("日本語")
    assert client_id("😀" * 10).startswith("h-")
    for raw, rule in [("\x00", "control"), ("a\nb", "control"), ("\ud800", "surrogate"),
                      ("x" * 257, "at most 256"), ("", "non-empty")]:  # fmt: skip
        with pytest.raises(ValueError, match=rule):
            client_id(raw, "user")


def test_the_resolver_takes_only_ids_in_the_safe_form() -> None:
    r = SessionResolver()
    msgs = [{"role": "user", "content": "x"}]
    for bad in ("a\nb", "a b", "\x00"):
        with pytest.raises(ValueError, match="client_id"):
            r.resolve_messages(msgs, explicit=bad)
    assert r.resolve_messages(msgs, explicit="h-0123abcd").session_id == "h-0123abcd"
