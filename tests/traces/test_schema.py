"""The AgSpec trace format: round trips and the schema check on hand-made broken files."""

from __future__ import annotations

import io
import json

import pytest

from agspec.traces import (
    Artifact,
    Call,
    Message,
    Session,
    TraceFormatError,
    check_file,
    iter_sessions,
    read_sessions,
    write_sessions,
)


def _session(sid: str = "s1") -> Session:
    sys_m, user_m = Message("system", "You code."), Message("user", "fix bug")
    a1 = Message("assistant", "open a.py")
    return Session(
        session_id=sid,
        source="swe-agent",
        model="m",
        task_id="t",
        calls=[
            Call("primary", "localize", 0, [sys_m, user_m], "open a.py"),
            Call(
                "primary",
                "code",
                1,
                [sys_m, user_m, a1, Message("user", "1:x = 1")],
                "edit 1:1\nx = 2\nend_of_edit",
                [Artifact("a.py", "x = 1\n", False)],
                "line_edit",
                "",
            ),
            # Not a prefix extension: the history was shortened.
            Call(
                "primary",
                "other",
                2,
                [sys_m, Message("user", "Old output omitted (1 lines)")],
                "submit",
            ),
        ],
    )


def test_round_trip_through_a_file(tmp_path):
    p = tmp_path / "t.jsonl"
    sessions = [_session("a"), _session("b"), Session("c", "chatdev", "m", "t", [])]
    assert write_sessions(sessions, p) == 3
    assert list(read_sessions(p)) == sessions
    assert check_file(p) == (3, [])


def test_reuse_messages_writes_shared_prefix_once():
    d = _session().to_dict()
    reuse = [c["reuse_messages"] for c in d["calls"]]
    assert reuse == [0, 2, 1]  # call 2 shares only the system message with call 1
    assert len(d["calls"][1]["messages"]) == 2


def _write_lines(tmp_path, lines: list[bytes]):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p


def _good_line() -> bytes:
    return json.dumps(_session().to_dict()).encode()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("session_id"), r"session\.session_id: missing field"),
        (lambda d: d["calls"][1].pop("output"), r"session\.calls\[1\]\.output: missing field"),
        (
            lambda d: d["calls"][0].update(turn="0"),
            r"calls\[0\]\.turn: expected integer, got string",
        ),
        (
            lambda d: d["calls"][0].update(turn=True),
            r"calls\[0\]\.turn: expected integer, got boolean",
        ),
        (lambda d: d["calls"][0].update(role="debug"), r"calls\[0\]\.role: 'debug' is not one of"),
        (
            lambda d: d["calls"][1]["artifacts"][0].update(complete="yes"),
            r"calls\[1\]\.artifacts\[0\]\.complete: expected boolean, got string",
        ),
        (
            lambda d: d["calls"][1].update(emission_format="patch"),
            r"calls\[1\]\.emission_format: 'patch' is not one of",
        ),
        (
            lambda d: d["calls"][0]["messages"][0].update(role="tool"),
            r"calls\[0\]\.messages\[0\]\.role: 'tool'",
        ),
        (
            lambda d: d["calls"][1].update(reuse_messages=3),
            r"calls\[1\]\.reuse_messages: 3 is outside 0\.\.2",
        ),
        (lambda d: d.update(format_version=99), r"format_version: 99 is not supported"),
        (lambda d: d.update(calls={}), r"session\.calls: expected array, got object"),
    ],
)
def test_schema_check_names_file_line_and_field(tmp_path, mutate, message):
    d = _session().to_dict()
    mutate(d)
    p = _write_lines(tmp_path, [_good_line(), json.dumps(d).encode()])
    n_ok, errors = check_file(p)
    assert n_ok == 1 and len(errors) == 1
    assert errors[0].startswith(f"{p}:2: ")
    assert pytest.importorskip("re").search(message, errors[0]), errors[0]
    with pytest.raises(TraceFormatError, match=message):
        list(read_sessions(p))


@pytest.mark.parametrize("keep", [0.5, 0.1, 0.999])
def test_truncated_line(tmp_path, keep):
    line = _good_line()
    cut = line[: int(len(line) * keep)]
    assert cut != line
    p = _write_lines(tmp_path, [line, cut])
    n_ok, errors = check_file(p)
    assert n_ok == 1 and len(errors) == 1
    assert errors[0].startswith(f"{p}:2: truncated line: ")


def test_non_utf8_line(tmp_path):
    p = _write_lines(tmp_path, [b'{"session_id": "\xff\xfe"}', _good_line()])
    n_ok, errors = check_file(p)
    assert n_ok == 1
    assert errors == [f"{p}:1: not valid UTF-8 (byte 16 of the line)"]
    with pytest.raises(TraceFormatError, match="not valid UTF-8"):
        next(read_sessions(p))


def test_not_an_object_and_invalid_json(tmp_path):
    p = _write_lines(tmp_path, [b"[1, 2]", b"{nope}"])
    _, errors = check_file(p)
    assert "1: session: expected a JSON object, got array" in errors[0]
    assert ":2: invalid JSON" in errors[1]


def test_read_is_a_stream():
    buf = io.StringIO()
    write_sessions([_session("a"), _session("b")], buf)
    it = iter_sessions(io.StringIO(buf.getvalue() + "{broken\n"), "mem")
    assert next(it).session_id == "a"
    assert next(it).session_id == "b"
    with pytest.raises(TraceFormatError, match="mem:3"):
        next(it)


def test_gzip_round_trip_and_damaged_gzip(tmp_path):
    from agspec.traces.io import read_sessions, write_sessions
    from agspec.traces.schema import Call, Message, Session, TraceFormatError

    s = Session(
        "s1",
        "test",
        "m",
        "t",
        [Call(agent="a", role="code", turn=0, messages=[Message("user", "hi")], output="ok")],
    )
    s2 = Session("s2", "test", "m", "t", list(s.calls))
    path = tmp_path / "t.jsonl.gz"
    assert write_sessions([s, s2], path) == 2
    assert list(read_sessions(path)) == [s, s2]
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(path.read_bytes()[:20])
    with pytest.raises(TraceFormatError, match="bad.jsonl.gz:1: truncated gzip file"):
        list(read_sessions(bad))
