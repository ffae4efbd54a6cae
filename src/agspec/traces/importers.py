"""Import third-party traces by format name: files or folders in, sessions and skips out.

>>> sessions, skipped = import_traces("chatdev", [])
>>> sessions, skipped
([], [])
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from agspec.traces.formats.chatdev import import_chatdev
from agspec.traces.formats.mini_swe_agent import import_mini_swe_agent
from agspec.traces.formats.swe_agent import import_swe_agent
from agspec.traces.schema import Session, TraceFormatError

__all__ = ["FORMATS", "Skipped", "import_traces", "iter_import", "find_trace_files"]

# Format name -> file-name suffix of that format's files.
FORMATS = {"swe-agent": ".traj", "mini-swe-agent": ".traj.json", "chatdev": ".log"}


class Skipped(NamedTuple):
    """A file (or part of one) that was not imported, and why."""

    path: str
    reason: str
    whole_file: bool  # False: the file was imported but parts of it were skipped


def find_trace_files(format: str, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files of `format` under `paths` (folders searched recursively, sorted)."""
    suffix = _suffix(format)
    out: list[str] = []
    for p in (os.fspath(x) for x in paths):
        if os.path.isdir(p):
            found = []
            for root, _dirs, files in os.walk(p):
                found += [os.path.join(root, f) for f in files if f.endswith(suffix)]
            out += sorted(found)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    return out


def iter_import(
    format: str,
    files: Sequence[str],
    *,
    keep_last_observations: int | None = 5,
    drop_repeated_blocks: bool = True,
    progress: bool = False,
) -> Iterator[Session | Skipped]:
    """Import each file in turn: yields its `Session`, preceded by any `Skipped` notes.

    A file that is not a readable trace of `format` yields one `Skipped(whole_file=True)`.
    """
    _suffix(format)
    it: Iterable[str] = files
    if progress:
        from tqdm import tqdm

        it = tqdm(files, desc=f"import {format}", unit="file", file=sys.stderr)
    for path in it:
        notes: list[str] = []
        try:
            if format == "swe-agent":
                session = import_swe_agent(path, keep_last_observations=keep_last_observations)
            elif format == "mini-swe-agent":
                session = import_mini_swe_agent(path)
            else:
                session = import_chatdev(path, notes, drop_repeated_blocks=drop_repeated_blocks)
        except TraceFormatError as exc:
            yield Skipped(path, _strip_name(str(exc), path), True)
            continue
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
            # Input no importer check foresaw: skip the file, say why, never a traceback.
            yield Skipped(path, f"cannot import it ({type(exc).__name__}: {exc})", True)
            continue
        for note in notes:
            yield Skipped(path, _strip_name(note, path), False)
        if not session.calls:
            yield Skipped(path, "no model calls in the file", True)
            continue
        yield session


def import_traces(
    format: str,
    paths: Iterable[str | os.PathLike[str]],
    *,
    keep_last_observations: int | None = 5,
    drop_repeated_blocks: bool = True,
    progress: bool = False,
) -> tuple[list[Session], list[Skipped]]:
    """All sessions of `format` under `paths`, and what was skipped and why.

    `format` is one of `FORMATS`; `keep_last_observations` is SWE-agent's history setting
    (`None`: full history); `drop_repeated_blocks` is ChatDev's duplicate-block rule.
    """
    sessions: list[Session] = []
    skipped: list[Skipped] = []
    files = find_trace_files(format, paths)
    for item in iter_import(
        format,
        files,
        keep_last_observations=keep_last_observations,
        drop_repeated_blocks=drop_repeated_blocks,
        progress=progress,
    ):
        (skipped if isinstance(item, Skipped) else sessions).append(item)  # type: ignore[arg-type]
    return sessions, skipped


def _suffix(format: str) -> str:
    if format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[format]


def _strip_name(message: str, path: str) -> str:
    return message[len(path) + 2 :] if message.startswith(path + ": ") else message
