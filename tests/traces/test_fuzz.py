"""Random bytes at every importer: a TraceFormatError (a ValueError) or a session, never a
crash or a hang. Also mutations of the hand-written fixtures, which reach deeper code."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agspec.traces import Session, TraceFormatError
from agspec.traces.formats.chatdev import parse_chatdev
from agspec.traces.formats.mini_swe_agent import parse_mini_swe_agent
from agspec.traces.formats.swe_agent import parse_swe_agent

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
PARSERS = [
    (parse_swe_agent, (FIXTURES / "swe_agent_small.traj.fixture").read_bytes()),
    (parse_mini_swe_agent, (FIXTURES / "mini_swe_agent_small.traj.json.fixture").read_bytes()),
    (parse_chatdev, (FIXTURES / "chatdev_small.log").read_bytes()),
]
_SETTINGS = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _run(parse, data: bytes) -> None:
    t0 = time.perf_counter()
    try:
        s = parse(data, "fuzz")
        assert isinstance(s, Session)
    except TraceFormatError as exc:
        assert str(exc)  # a message, not an empty error
    assert time.perf_counter() - t0 < 2.0


@_SETTINGS
@given(st.binary(max_size=2000))
def test_random_bytes(data):
    for parse, _ in PARSERS:
        _run(parse, data)


@_SETTINGS
@given(st.data())
def test_mutated_fixtures(data):
    for parse, seed in PARSERS:
        n = len(seed)
        i = data.draw(st.integers(0, n), label="start")
        j = data.draw(st.integers(i, min(n, i + 200)), label="end")
        insert = data.draw(st.binary(max_size=50), label="insert")
        _run(parse, seed[:i] + insert + seed[j:])


@_SETTINGS
@given(st.text(alphabet=st.sampled_from(list('{}[]":,0123456789 \ntruefalsnul\\')), max_size=300))
def test_json_shaped_text(text):
    for parse, _ in PARSERS:
        _run(parse, text.encode())


def test_deep_json_nesting_is_a_format_error():
    for parse, _ in PARSERS:
        _run(parse, b"[" * 100_000)


_START = b"[2024-01-01 10:00:00 INFO] A: **[Start Chat]**\n\n[s]\n\n"
_ADVERSARIAL = [
    # Inputs that make naive regexes quadratic or worse (each once took seconds).
    (parse_chatdev, _START + b"p\n[2024-01-01 10:00:00 INFO] a: **" + b"<->" * 20000),
    (parse_chatdev, _START + b"p\n[2024-01-01 10:00:00 INFO] a: **" + b"x<->y on : " * 5000),
    (parse_chatdev, _START + b'Codes:\n"' + b"a." * 50000 + b"\n```\n"),
]


def _mini(command: str, observation: str) -> bytes:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": f"```bash\n{command}\n```"},
        {"role": "user", "content": observation},
        {"role": "assistant", "content": "done"},
    ]
    return json.dumps({"trajectory_format": "mini-swe-agent-1", "messages": msgs}).encode()


_ELIDED = "\n</output_head>\n<elided_chars></elided_chars>\n<output_tail>\n" * 2000
_ADVERSARIAL += [
    (
        parse_mini_swe_agent,
        _mini("cat a.py", "<returncode>0</returncode>\n<output_head>\n" + _ELIDED),
    ),
    (parse_mini_swe_agent, _mini(">" * 20000, "")),
    (parse_mini_swe_agent, _mini("open(" * 20000, "")),
]


@pytest.mark.parametrize("case", range(len(_ADVERSARIAL)))
def test_adversarial_inputs_are_fast(case):
    parse, data = _ADVERSARIAL[case]
    t0 = time.perf_counter()
    try:
        parse(data, "adversarial")
    except TraceFormatError:
        pass
    assert time.perf_counter() - t0 < 1.0
