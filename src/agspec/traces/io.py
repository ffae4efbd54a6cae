"""Read, write and check AgSpec trace files (JSONL, one session per line).

`read_sessions` streams: it holds one session in memory at a time. Errors name the file,
the 1-based line and the field, e.g.
`runs.jsonl:3: session.calls[2].turn: expected integer, got string`.

>>> import io as _io
>>> s = Session("s1", "swe-agent", "m", "t", [])
>>> buf = _io.StringIO()
>>> write_sessions([s], buf)
1
>>> next(iter_sessions(_io.StringIO(buf.getvalue()), "buf")) == s
True
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from typing import IO

from agspec.traces.schema import Session, TraceFormatError

__all__ = ["read_sessions", "iter_sessions", "write_sessions", "check_file"]


def read_sessions(path: str | os.PathLike[str]) -> Iterator[Session]:
    """Sessions of the JSONL file at `path`, in order, one at a time.

    Raises `TraceFormatError` at the first bad line (file, line, field in the message).
    """
    p = os.fspath(path)
    # Bytes in, strict UTF-8 per line: a bad byte is reported with its line number.
    with _open_bytes(p) as f:
        try:
            yield from _iter_lines(f, p)
        except (gzip.BadGzipFile, EOFError) as exc:
            raise TraceFormatError(f"{p}: damaged gzip file ({exc})") from None


def _open_bytes(path: str) -> IO[bytes]:
    """The file, decompressed when its name ends in .gz."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def iter_sessions(stream: IO[str], name: str = "<stream>") -> Iterator[Session]:
    """Sessions from an open text stream (see `read_sessions`)."""
    for lineno, line in enumerate(stream, start=1):
        if line.strip():
            yield _parse_line(line, name, lineno)


def _iter_lines(f: IO[bytes], name: str) -> Iterator[Session]:
    for lineno, raw in enumerate(f, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{name}:{lineno}: not valid UTF-8 (byte {exc.start} of the line)"
            ) from None
        if line.strip():
            yield _parse_line(line, name, lineno)


def _parse_line(line: str, name: str, lineno: int) -> Session:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        # A session line is an object: one that stops before its closing brace was cut off.
        body = line.rstrip()
        truncated = body.startswith("{") and (exc.pos >= len(body) or not body.endswith("}"))
        what = "truncated line" if truncated else "invalid JSON"
        raise TraceFormatError(f"{name}:{lineno}: {what}: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise TraceFormatError(f"{name}:{lineno}: JSON nested too deeply") from None
    try:
        return Session.from_dict(obj)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{name}:{lineno}: {exc}") from None


def write_sessions(sessions: Iterable[Session], out: IO[str] | str | os.PathLike[str]) -> int:
    """Write sessions as JSONL to a path or a text stream; returns how many were written."""
    if isinstance(out, (str, os.PathLike)):
        p = os.fspath(out)
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "wt", encoding="utf-8") as f:
            return write_sessions(sessions, f)
    n = 0
    for s in sessions:
        out.write(json.dumps(s.to_dict(), ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
        n += 1
    return n


def check_file(path: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """Schema-check every line of a trace file: `(num_valid_sessions, errors)`.

    Unlike `read_sessions`, it keeps going after a bad line and reports them all.
    """
    p = os.fspath(path)
    n_ok = 0
    errors: list[str] = []
    with _open_bytes(p) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append(f"{p}:{lineno}: not valid UTF-8 (byte {exc.start} of the line)")
                continue
            if not line.strip():
                continue
            try:
                _parse_line(line, p, lineno)
                n_ok += 1
            except TraceFormatError as exc:
                errors.append(str(exc))
    return n_ok, errors
