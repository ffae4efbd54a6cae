"""Resumable recording: one JSONL line per finished session, plus a live-stats sidecar.

`<out>` holds sessions in the AgSpec trace format (`docs/traces.md`); the format has no
field for live statistics or a session's outcome, so `<out>.live.jsonl` holds one record
per session, keyed by `session_id`: status, detail, settings, and per call (by index)
the output ids, the stop reason and every step's `[drafted, accepted, committed]`.

Each record is written with a single `write` on an append-mode file followed by `fsync`:
the sidecar line first, then the trace line. A session counts as recorded when its trace
line is there. On open, a last line cut by an interruption is removed from both files,
and sidecar records of sessions without a trace line (or repeated) are dropped, so a
resumed run neither duplicates nor loses a session.

>>> import tempfile, os
>>> from agspec.traces.schema import Session
>>> path = os.path.join(tempfile.mkdtemp(), "t.jsonl")
>>> rec = Recorder(path)
>>> rec.write(Session("s1", "agspec-pipeline", "m", "t1", []), {"status": "passed"})
>>> Recorder(path).done
{'s1'}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agspec._files import atomic_output
from agspec.traces.schema import Session

__all__ = ["Recorder", "sidecar_path", "read_sidecar"]


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """`traces.jsonl` → `traces.live.jsonl` (`x.jsonl.gz` → `x.live.jsonl.gz`)."""
    p = Path(path)
    name = p.name
    for ext in (".jsonl.gz", ".jsonl"):
        if name.endswith(ext):
            return p.with_name(name[: -len(ext)] + ".live" + ext)
    return p.with_name(name + ".live.jsonl")


def _complete_lines(path: Path) -> list[bytes]:
    """The file's lines that end with a newline and parse as JSON objects."""
    if not path.exists():
        return []
    data = path.read_bytes()
    out = []
    # The piece after the last newline is empty, or a line cut by an interruption.
    for raw in data.split(b"\n")[:-1]:
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
            out.append(raw)
    return out


def read_sidecar(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Sidecar records by session id (plain or `.gz`)."""
    import gzip

    p = Path(path)
    opener: Any = gzip.open if p.suffix == ".gz" else open
    out: dict[str, dict[str, Any]] = {}
    with opener(p, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out[rec["session_id"]] = rec
    return out


class Recorder:
    """Appends finished sessions to `path` (and their live stats to the sidecar)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.live_path = sidecar_path(self.path)
        if self.path.suffix == ".gz":
            raise ValueError("record into a plain .jsonl file; compress it afterwards")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        trace_lines = _complete_lines(self.path)
        self.done: set[str] = set()
        kept: list[bytes] = []
        for raw in trace_lines:
            sid = json.loads(raw)["session_id"]
            if sid not in self.done:  # a repeated session id keeps its first line
                self.done.add(sid)
                kept.append(raw)
        live: dict[str, bytes] = {}
        for raw in _complete_lines(self.live_path):
            sid = json.loads(raw)["session_id"]
            if sid in self.done:
                live[sid] = raw  # the last record of a session wins
        self._rewrite_if_changed(self.path, kept)
        kept_ids = [json.loads(raw)["session_id"] for raw in kept]
        self._rewrite_if_changed(self.live_path, [live[s] for s in kept_ids if s in live])

    @staticmethod
    def _rewrite_if_changed(path: Path, lines: list[bytes]) -> None:
        body = b"".join(line + b"\n" for line in lines)
        if path.exists() and path.read_bytes() == body:
            return
        if not path.exists() and not lines:
            return
        with atomic_output(path) as tmp:  # the old file or the repaired one, never half
            tmp.write_bytes(body)

    @staticmethod
    def _append(path: Path, obj: dict[str, Any]) -> None:
        line = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(self, session: Session, live: dict[str, Any]) -> None:
        """Record one finished session; a session already recorded is an error."""
        if session.session_id in self.done:
            raise ValueError(f"session {session.session_id!r} is already in {self.path}")
        self._append(self.live_path, {"session_id": session.session_id, **live})
        self._append(self.path, session.to_dict())
        self.done.add(session.session_id)
