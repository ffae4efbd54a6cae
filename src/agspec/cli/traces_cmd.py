"""`agspec traces`: import third-party traces, check and summarize AgSpec trace files.

agspec traces import swe-agent ../shared/data/traces/swe-agent-java -o swe.jsonl
agspec traces check swe.jsonl
agspec traces stats swe.jsonl mini.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from agspec.traces.importers import IMPORTERS, Skipped, find_trace_files, iter_import


def register(sub: Any) -> None:
    p = sub.add_parser("traces", help="import, check and summarize agent traces")
    tsub = p.add_subparsers(dest="traces_command", metavar="SUBCOMMAND", required=True)

    imp = tsub.add_parser("import", help="convert third-party traces to AgSpec JSONL")
    imp.add_argument("format", choices=sorted(IMPORTERS), help="the traces' format")
    imp.add_argument("paths", nargs="+", help="trace files or folders (searched recursively)")
    imp.add_argument("-o", "--output", required=True, help="output .jsonl file")
    imp.add_argument(
        "--keep-last-observations",
        default="5",
        help="swe-agent: observations kept in full before each call (default 5, as "
        "SWE-agent 0.x's Last5Observations); 'all' keeps the whole history",
    )
    imp.add_argument(
        "--keep-repeated-blocks",
        action="store_true",
        help="chatdev: keep an output block that repeats the one before it as a call",
    )
    imp.add_argument("--no-progress", action="store_true", help="no progress bar")
    imp.set_defaults(func=_import)

    chk = tsub.add_parser("check", help="schema-check AgSpec trace files")
    chk.add_argument("files", nargs="+")
    chk.set_defaults(func=_check)

    st = tsub.add_parser("stats", help="per-source and per-role counts of AgSpec trace files")
    st.add_argument("files", nargs="+")
    st.add_argument("--tokenizer", default="qwen2.5", help="tokenizer name (default qwen2.5)")
    st.set_defaults(func=_stats)


def _import(args: argparse.Namespace) -> int:
    from agspec._files import atomic_output, check_not_input
    from agspec.traces.io import write_sessions

    keep = args.keep_last_observations
    if keep == "all":
        keep_n: int | None = None
    else:
        try:
            keep_n = int(keep)
        except ValueError:
            raise ValueError(
                f"--keep-last-observations: expected a number or 'all', got {keep!r}"
            ) from None
    files = find_trace_files(args.format, args.paths)
    if not files:
        raise ValueError(
            f"no {args.format} trace files (*{IMPORTERS.get(args.format).suffix}) under "
            f"{', '.join(args.paths)}; nothing written"
        )
    check_not_input(args.output, files)
    num_sessions = num_calls = 0
    skipped: list[Skipped] = []
    seen: set[str] = set()
    # Written whole or not at all: an interrupted import leaves no output file.
    with atomic_output(args.output) as tmp:
        with _open_text(tmp, args.output) as out:
            for item in iter_import(
                args.format,
                files,
                keep_last_observations=keep_n,
                drop_repeated_blocks=not args.keep_repeated_blocks,
                progress=not args.no_progress,
            ):
                if isinstance(item, Skipped):
                    skipped.append(item)
                    continue
                if item.session_id in seen:
                    raise ValueError(
                        f"two input files give session id {item.session_id!r} (files of the "
                        "same name in different folders?); import them into separate files"
                    )
                seen.add(item.session_id)
                write_sessions([item], out)
                num_sessions += 1
                num_calls += len(item.calls)
        if not num_sessions:
            for s in skipped:
                print(f"skipped: {s.path}: {s.reason}", file=sys.stderr)
            raise ValueError(
                f"none of the {len(files)} files gave a session; nothing written to {args.output}"
            )
    whole = [s for s in skipped if s.whole_file]
    for s in skipped:
        kind = "skipped" if s.whole_file else "partly skipped"
        print(f"{kind}: {s.path}: {s.reason}", file=sys.stderr)
    print(
        f"{len(files)} files: {num_sessions} sessions ({num_calls} calls) written to "
        f"{args.output}, {len(whole)} files skipped"
    )
    return 0


def _open_text(tmp: Any, target: str) -> Any:
    """A text stream on `tmp`, gzip-compressed when `target` ends in .gz."""
    import gzip

    if target.endswith(".gz"):
        return gzip.open(tmp, "wt", encoding="utf-8")
    return open(tmp, "w", encoding="utf-8")


def _check(args: argparse.Namespace) -> int:
    from agspec.traces.io import scan_file
    from agspec.traces.schema import TraceFormatError

    bad = 0
    # A session id may appear once across the files, as `agspec replay` requires of the
    # files it is given together.
    first_seen: dict[str, str] = {}
    for f in args.files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"no such trace file: {f}")
        n_ok, errors = 0, []
        for lineno, item in scan_file(f):
            if isinstance(item, TraceFormatError):
                errors.append(str(item))
                continue
            where = f"{f}:{lineno}"
            other = first_seen.setdefault(item.session_id, where)
            if other != where:
                errors.append(
                    f"{where}: session.session_id: {item.session_id!r} is also at {other}; "
                    "files replayed together need distinct session ids"
                )
                continue
            n_ok += 1
        fmt = _raw_format(f) if errors and not n_ok else None
        if fmt is not None:
            # A scaffold's own file, not AgSpec traces: one line, not an error per line.
            print(
                f"{f}: a raw {fmt} file, not AgSpec traces; import it first: "
                f"agspec traces import {fmt} {f} -o traces.jsonl",
                file=sys.stderr,
            )
            errors = [f"{f}: not AgSpec traces"]
        else:
            for e in errors:
                print(e, file=sys.stderr)
        bad += len(errors)
        print(f"{f}: {n_ok} sessions ok, {len(errors)} errors")
    return 1 if bad else 0


def _raw_format(path: str) -> str | None:
    """The importer whose files are named like `path` (`x.traj.json`: mini-swe-agent)."""
    by_suffix = sorted(IMPORTERS, key=lambda name: -len(IMPORTERS.get(name).suffix))
    return next((n for n in by_suffix if path.endswith(IMPORTERS.get(n).suffix)), None)


def _stats(args: argparse.Namespace) -> int:
    from agspec.traces.io import read_sessions
    from agspec.traces.stats import TraceStats

    t0 = time.perf_counter()
    stats = TraceStats()
    for f in args.files:
        for s in read_sessions(f):
            stats.add(s, args.tokenizer)
    print(stats.table(), end="")
    print(f"(tokenizer {args.tokenizer}, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0
