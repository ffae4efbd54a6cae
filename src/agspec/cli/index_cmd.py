"""`agspec index build | query`: a token index over a folder of text files, and its matches.

`build` tokenizes every text file under the given folders (one document per file; binary and
non-UTF-8 files are skipped and counted), saves the index's frozen form to FILE and the
document-id -> path mapping to the JSON sidecar `FILE.docs.json`. `query` tokenizes TEXT with
the same tokenizer, feeds it to a match cursor and prints the longest suffix of TEXT that
occurs in the files, where it occurs (path:line, most recent first) and the tokens that follow.

Example (qwen2.5 tokens, run in the repository):

    $ agspec index build src/ -o /tmp/src.idx --glob '*.py'
    files 44 (skipped: 0 binary or non-UTF-8, 0 empty), tokens 71,609, text 280,701 bytes
    index 11,923,824 bytes in memory, 9,075,300 bytes on disk -> /tmp/src.idx
    seconds 0.87 (read+tokenize 0.74, index 0.10, save 0.04)
    $ agspec index query /tmp/src.idx 'def register(subparsers'
    match 4 tokens: 'def register(subparsers'
    occurrences (5 shown, most recent first):
      src/agspec/cli/replay_cmd.py:18
      src/agspec/cli/models_cmd.py:19
      ...
    continuation (16 tokens, rule frequent):
    : argparse._SubParsersAction) -> None:
        replay = subparsers
"""

from __future__ import annotations

import argparse
import json
import os

from agspec.corpora.global_build import SIDECAR_SUFFIX, build_index, query_index


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index", help="build a token index over text files and query it for matches"
    )
    sub = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)

    build = sub.add_parser(
        "build",
        help="tokenize every text file under FOLDERs into one index file",
        description=(
            "One document per text file. Binary files (a NUL byte), non-UTF-8 and empty "
            "files are skipped and counted; files and folders whose name starts with '.' "
            "are not looked at. "
            f"Writes FILE (the frozen index) and FILE{SIDECAR_SUFFIX} (doc id -> path)."
        ),
    )
    build.add_argument("folders", nargs="+", metavar="FOLDER", help="folders (or files) to index")
    build.add_argument("-o", "--output", required=True, metavar="FILE", help="index file to write")
    build.add_argument("--tokenizer", default="qwen2.5", help="tokenizer name (default qwen2.5)")
    build.add_argument(
        "--glob",
        action="append",
        default=None,
        metavar="PATTERN",
        help="only files whose name matches PATTERN, e.g. '*.py' (repeatable; default: all)",
    )
    build.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    build.set_defaults(func=_build)

    query = sub.add_parser(
        "query",
        help="print the longest match of TEXT's end, its occurrences and continuation",
        description=(
            "TEXT is tokenized with the index's tokenizer; the match is the longest suffix of "
            "TEXT's tokens that occurs in the index with at least one token after it."
        ),
    )
    query.add_argument("index", metavar="FILE", help="index file written by `agspec index build`")
    query.add_argument("text", metavar="TEXT", help="the text whose end is matched")
    query.add_argument(
        "--max-tokens", type=int, default=16, help="continuation length in tokens (default 16)"
    )
    query.add_argument(
        "--rule",
        choices=("frequent", "first"),
        default="frequent",
        help="frequent: most common next-3-token group, ties to the most recent; "
        "first: the earliest occurrence (default frequent)",
    )
    query.add_argument(
        "--max-occurrences",
        type=int,
        default=10,
        help="occurrences to print, most recent first (default 10)",
    )
    query.add_argument("--json", action="store_true", help="print one JSON object instead")
    query.set_defaults(func=_query)


# -- build ----------------------------------------------------------------------------


def _build(args: argparse.Namespace) -> int:
    stats = build_index(
        args.folders,
        args.output,
        tokenizer_name=args.tokenizer,
        globs=args.glob,
        progress=not args.quiet,
    )
    print(
        f"files {stats.files:,} (skipped: {stats.skipped_binary:,} binary or non-UTF-8, "
        f"{stats.skipped_empty:,} empty), tokens {stats.tokens:,}, text {stats.text_bytes:,} bytes"
    )
    print(
        f"index {stats.index_bytes:,} bytes in memory, {stats.file_bytes:,} bytes on disk "
        f"-> {args.output}"
    )
    print(
        f"seconds {stats.total_s:.2f} (read+tokenize {stats.read_tokenize_s:.2f}, "
        f"index {stats.index_s:.2f}, save {stats.save_s:.2f})"
    )
    return 0


def _display_path(path: str) -> str:
    """Relative to the working folder when under it: `/work/main/src/a.py` -> `src/a.py`."""
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path


def _query(args: argparse.Namespace) -> int:
    result = query_index(
        args.index,
        args.text,
        max_tokens=args.max_tokens,
        rule=args.rule,
        max_occurrences=args.max_occurrences,
    )
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    occurrences = result["occurrences"]
    assert isinstance(occurrences, list)
    print(f"match {result['match_tokens']} tokens: {result['match_text']!r}")
    if not result["match_tokens"]:
        print("no match: no suffix of the text occurs in the index with a token after it")
        return 0
    print(f"occurrences ({len(occurrences)} shown, most recent first):")
    for occ in occurrences:
        print(f"  {_display_path(str(occ['path']))}:{occ['line']}")
    n = len(result["continuation_tokens"])  # type: ignore[arg-type]
    print(f"continuation ({n} tokens, rule {result['rule']}):")
    print(result["continuation_text"])
    return 0
