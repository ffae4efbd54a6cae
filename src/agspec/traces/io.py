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
import zlib
from collections.abc import Iterable, Iterator
from typing import IO

from agspec._files import atomic_output
from agspec.traces.schema import HugeInt, Session, TraceFormatError

__all__ = ["read_sessions", "iter_sessions", "write_sessions", "check_file", "scan_file"]


def read_sessions(path: str | os.PathLike[str]) -> Iterator[Session]:
    """Sessions of the JSONL file at `path`, in order, one at a time.

    Raises `TraceFormatError` at the first bad line (file, line, field in the message):
    bad JSON or UTF-8, a session that breaks the schema, a `session_id` an earlier line
    already used, a damaged `.gz`. `check_file` reports exactly the same errors.
    """
    for _lineno, item in scan_file(os.fspath(path)):
        if isinstance(item, TraceFormatError):
            raise item
        yield item


def check_file(path: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """Schema-check every line of a trace file: `(num_valid_sessions, errors)`.

    Unlike `read_sessions`, it keeps going after a bad line and reports them all; a file
    it reports no error for is one `read_sessions` reads to the end.
    """
    n_ok = 0
    errors: list[str] = []
    for _lineno, item in scan_file(os.fspath(path)):
        if isinstance(item, TraceFormatError):
            errors.append(str(item))
        else:
            n_ok += 1
    return n_ok, errors


def _open_bytes(path: str) -> IO[bytes]:
    """The file, decompressed when its name ends in .gz."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def iter_sessions(stream: IO[str], name: str = "<stream>") -> Iterator[Session]:
    """Sessions from an open text stream (see `read_sessions`)."""
    seen: dict[str, int] = {}
    for lineno, line in enumerate(stream, start=1):
        if line.strip():
            session = _parse_line(line, name, lineno)
            _check_unique(session, seen, name, lineno)
            yield session


def scan_file(path: str | os.PathLike[str]) -> Iterator[tuple[int, Session | TraceFormatError]]:
    """`(line number, session or error)` of each non-blank line, in order; a damaged .gz
    ends the scan with an error naming the line it could not read. What `read_sessions`
    and `check_file` are built on."""
    path = os.fspath(path)
    seen: dict[str, int] = {}
    lineno = 0
    with _open_bytes(path) as f:
        lines = iter(f)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                what = "truncated" if isinstance(exc, EOFError) else "damaged"
                yield (
                    lineno + 1,
                    TraceFormatError(
                        f"{path}:{lineno + 1}: {what} gzip file ({exc}); "
                        f"{lineno} lines were read before it"
                    ),
                )
                return
            lineno += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield (
                    lineno,
                    TraceFormatError(
                        f"{path}:{lineno}: not valid UTF-8 (byte {exc.start} of the line)"
                    ),
                )
                continue
            if not line.strip():
                continue
            try:
                session = _parse_line(line, path, lineno)
                _check_unique(session, seen, path, lineno)
            except TraceFormatError as exc:
                yield lineno, exc
                continue
            yield lineno, session


def _check_unique(session: Session, seen: dict[str, int], name: str, lineno: int) -> None:
    first = seen.setdefault(session.session_id, lineno)
    if first != lineno:
        raise TraceFormatError(
            f"{name}:{lineno}: session.session_id: {session.session_id!r} repeats line "
            f"{first}; each session id must be unique"
        )


def _parse_line(line: str, name: str, lineno: int) -> Session:
    try:
        obj = json.loads(line, parse_int=_parse_int)
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


def _parse_int(text: str) -> int | HugeInt:
    # A number no trace field can hold is kept as text, so that the schema check names
    # its field (int() of 5,000 digits would stop the parse with no field).
    return int(text) if len(text) <= 18 else HugeInt(text)


def write_sessions(sessions: Iterable[Session], out: IO[str] | str | os.PathLike[str]) -> int:
    """Write sessions as JSONL to a path or a text stream; returns how many were written.

    A path is written whole or not at all (a temporary file renamed when complete).
    """
    if isinstance(out, (str, os.PathLike)):
        p = os.fspath(out)
        with atomic_output(p) as tmp:
            opener = gzip.open if p.endswith(".gz") else open
            with opener(tmp, "wt", encoding="utf-8") as f:
                return write_sessions(sessions, f)
    n = 0
    for s in sessions:
        out.write(json.dumps(s.to_dict(), ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
        n += 1
    return n
