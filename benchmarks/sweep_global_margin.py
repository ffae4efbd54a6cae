"""Sweep δ, the margin by which the global corpus must beat the live matches (paper §3.1).

    python benchmarks/sweep_global_margin.py TRACES... -o DIR [--deltas 0 2 4 8 16 64]

Registers one AgSpec variant per δ and runs the replay lab on them at batch size 1 with the
same split, cost model and settings as `agspec replay`; the table it prints is the lab's.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from agspec.cli import main as cli_main
from agspec.drafter import VARIANTS
from agspec.drafter.replay import replay_factory
from agspec.lab.registry import register_drafter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--deltas", type=int, nargs="+", default=[0, 2, 4, 8, 16, 64])
    ap.add_argument("--base", default="agspec-paper", help="variant whose δ is swept")
    ap.add_argument("--cost-model", default="h200-qwen2.5-32b")
    ap.add_argument("--limit-sessions", type=int)
    args = ap.parse_args()
    names = []
    for delta in args.deltas:
        name = f"{args.base}-delta{delta}"
        config = replace(VARIANTS[args.base], global_margin_tokens=delta)
        register_drafter(name, replay_factory(name, config))
        names.append(name)
    argv = [
        "replay",
        *args.traces,
        "--drafters",
        *names,
        "--batch-size",
        "1",
        "--cost-model",
        args.cost_model,
        "-o",
        args.out,
        "--no-plots",
        "--no-steps",
        "--no-progress",
    ]
    if args.limit_sessions:
        argv += ["--limit-sessions", str(args.limit_sessions)]
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
