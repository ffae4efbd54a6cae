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


# One example per command, shown at the end of its --help (tests/cli/test_cli.py parses
# each with the real parser). `agspec serve` keeps its own.
EXAMPLES = {
    "": "agspec models fetch qwen2.5-coder-0.5b-instruct\n"
    "agspec replay src/agspec/data/traces/default.jsonl.gz --drafters agspec pld-hf -o runs/r",
    "profile": "agspec profile runs/traces.jsonl --cost-model h200-qwen2.5-32b -o runs/caps.json",
    "index": "agspec index build my-repo -o runs/repo.agidx",
    "index build": "agspec index build my-repo -o runs/repo.agidx --glob '*.py'",
    "index query": "agspec index query runs/repo.agidx 'def main('",
    "replay": "agspec replay src/agspec/data/traces/default.jsonl.gz "
    "--drafters ar pld-hf agspec --batch-size 1 16 --cost-model h200-qwen2.5-32b -o runs/default",
    "report": "agspec report runs/default --markdown",
    "traces": "agspec traces import mini-swe-agent trajs/ -o runs/mini.jsonl",
    "traces import": "agspec traces import mini-swe-agent trajs/ -o runs/mini.jsonl",
    "traces check": "agspec traces check runs/mini.jsonl",
    "traces stats": "agspec traces stats runs/mini.jsonl --tokenizer qwen2.5",
    "models": "agspec models fetch smollm2-135m-instruct",
    "models fetch": "agspec models fetch smollm2-135m-instruct",
    "models list": "agspec models list",
    "models path": "agspec models path qwen2.5-coder-0.5b-instruct",
    "costmodel": "agspec costmodel measure --model qwen2.5-coder-0.5b-instruct -o runs/cost.json",
    "costmodel measure": "agspec costmodel measure --model qwen2.5-coder-0.5b-instruct "
    "-o runs/cost.json --threads 2",
    "record": "agspec record paginate leap-years --drafter agspec -o runs/rec/traces.jsonl",
}


class _ExampleFormatter(argparse.HelpFormatter):
    """argparse's formatter, keeping the example epilog's lines as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def subcommands(parser: argparse.ArgumentParser, path: str = ""):  # noqa: ANN201
    """(command path, parser) of `parser` and of every subcommand below it, e.g.
    `("traces check", <parser>)`."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommands(child, f"{path} {name}".strip())


def add_examples(parser: argparse.ArgumentParser, examples: dict[str, str]) -> None:
    """Ends each command's --help with its example from `examples` (by command path)."""
    for path, p in subcommands(parser):
        example = examples.get(path)
        if example is None or p.epilog:
            continue
        lines = example.splitlines()
        head = "example:" if len(lines) == 1 else "examples:"
        p.epilog = head + "".join(f"\n  {line}" for line in lines)
        if p.formatter_class is argparse.HelpFormatter:
            p.formatter_class = _ExampleFormatter


def build_parser() -> argparse.ArgumentParser:
    from agspec import __version__

    parser = argparse.ArgumentParser(
        prog="agspec",
        description="AgSpec: retrieval-based speculative decoding for coding agents.",
    )
    parser.add_argument("--version", action="version", version=f"agspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _GROUPS:
        module = importlib.import_module(f"agspec.cli.{name}")
        module.register(sub)
    add_examples(parser, EXAMPLES)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, KeyError, ImportError) as exc:
        # Bad input, or an optional engine that is not installed (the adapters' message
        # names the install command), is reported in one line, never as a traceback.
        print(f"agspec {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: one line and the shell's code for SIGINT; outputs are whole or absent.
        print(f"agspec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
