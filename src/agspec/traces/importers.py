"""Import third-party traces by format name: files or folders in, sessions and skips out.

>>> sessions, skipped = import_traces("chatdev", [])
>>> sessions, skipped
([], [])
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agspec._registry import Registry
from agspec.traces.formats.chatdev import import_chatdev
from agspec.traces.formats.mini_swe_agent import import_mini_swe_agent
from agspec.traces.formats.swe_agent import import_swe_agent
from agspec.traces.schema import Session, TraceFormatError

__all__ = [
    "IMPORTERS",
    "ImportOptions",
    "Skipped",
    "TraceFormat",
    "find_trace_files",
    "import_traces",
    "iter_import",
]


@dataclass(frozen=True)
class ImportOptions:
    """The settings of an import; each format reads the ones that concern it."""

    keep_last_observations: int | None = 5  # swe-agent's history setting; None: all
    drop_repeated_blocks: bool = True  # chatdev's duplicate-block rule


@dataclass(frozen=True)
class TraceFormat:
    """One importable format: its files' name suffix and its reader of one file.

    `read(path, options, notes)` returns the file's `Session`; parts it skipped are
    described in `notes`; a file it cannot read raises `TraceFormatError`.
    """

    suffix: str
    read: Callable[[str, ImportOptions, list[str]], Session]


def _swe_agent(path: str, options: ImportOptions, notes: list[str]) -> Session:
    return import_swe_agent(path, keep_last_observations=options.keep_last_observations)


def _mini_swe_agent(path: str, options: ImportOptions, notes: list[str]) -> Session:
    return import_mini_swe_agent(path)


def _chatdev(path: str, options: ImportOptions, notes: list[str]) -> Session:
    return import_chatdev(path, notes, drop_repeated_blocks=options.drop_repeated_blocks)


IMPORTERS: Registry[TraceFormat] = Registry("trace format")
IMPORTERS.register("swe-agent", TraceFormat(".traj", _swe_agent), help="SWE-agent 0.x .traj")
IMPORTERS.register(
    "mini-swe-agent",
    TraceFormat(".traj.json", _mini_swe_agent),
    help="mini-swe-agent 1.x .traj.json",
)
IMPORTERS.register("chatdev", TraceFormat(".log", _chatdev), help="ChatDev 1.0 .log")


class Skipped(NamedTuple):
    """A file (or part of one) that was not imported, and why."""

    path: str
    reason: str
    whole_file: bool  # False: the file was imported but parts of it were skipped


def find_trace_files(format: str, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files of `format` under `paths` (folders searched recursively, sorted)."""
    suffix = IMPORTERS.get(format).suffix
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
    reader = IMPORTERS.get(format).read
    options = ImportOptions(
        keep_last_observations=keep_last_observations, drop_repeated_blocks=drop_repeated_blocks
    )
    it: Iterable[str] = files
    if progress:
        from tqdm import tqdm

        it = tqdm(files, desc=f"import {format}", unit="file", file=sys.stderr)
    for path in it:
        notes: list[str] = []
        try:
            session = reader(path, options, notes)
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

    `format` is one of `IMPORTERS`; `keep_last_observations` is SWE-agent's history setting
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


def _strip_name(message: str, path: str) -> str:
    return message[len(path) + 2 :] if message.startswith(path + ": ") else message
