"""The `agspec` command line.

Each command group lives in its own module `agspec.cli.<name>` with a
`register(subparsers)` function that adds its parser and sets `func`.
Adding a group is one line in `_GROUPS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Module names under agspec.cli, in the order `agspec --help` lists them.
_GROUPS = [
    "profile_cmd",
    "index_cmd",
    "replay_cmd",
    "traces_cmd",
    "models_cmd",
    "costmodel_cmd",
    "record_cmd",
    "serve_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agspec",
        description="AgSpec: retrieval-based speculative decoding for coding agents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _GROUPS:
        module = importlib.import_module(f"agspec.cli.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, KeyError) as exc:
        # Bad input is reported in one line, never as a traceback.
        print(f"agspec {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: one line and the shell's code for SIGINT; outputs are whole or absent.
        print(f"agspec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
