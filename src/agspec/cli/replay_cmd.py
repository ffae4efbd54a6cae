"""`agspec replay TRACES... -o DIR` and `agspec report DIR...` (see `agspec.lab`).

Example:

    $ agspec replay traces/swe.jsonl --drafters ar pld-hf oracle --batch-size 1 16 \\
          --cost-model h200-qwen2.5-32b -o runs/swe
    source     drafter  B=1 speedup  tok/step  accept  w/ draft  draft us/tok ...
    $ agspec report runs/swe runs/chatdev --plots runs/plots
"""

from __future__ import annotations

import argparse
import sys
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    replay = subparsers.add_parser(
        "replay", help="replay traces against drafters and model the speedup over AR"
    )
    replay.add_argument(
        "traces", nargs="+", help="AgSpec-format JSONL traces (agspec traces import)"
    )
    replay.add_argument(
        "--drafters", nargs="+", default=None, help="drafter names (default: every known one)"
    )
    replay.add_argument(
        "--batch-size", nargs="+", type=int, default=[1, 16], help="batch sizes (default 1 16)"
    )
    replay.add_argument(
        "--cost-model", default="h200-qwen2.5-32b", help="cost model preset name or profile path"
    )
    replay.add_argument("-o", "--out", required=True, help="run folder to write")
    replay.add_argument(
        "--limit-sessions",
        type=int,
        default=None,
        help="replay only the first N sessions of each source",
    )
    replay.add_argument(
        "--max-draft-tokens",
        type=int,
        default=64,
        help="draft budget passed to propose() (default 64)",
    )
    replay.add_argument(
        "--batch-cost",
        choices=["mean", "max"],
        default="mean",
        help="tokens per request in a batch step: 1 + mean draft (vLLM's "
        "ragged batch, default) or 1 + longest draft (padded batch)",
    )
    replay.add_argument(
        "--oracle-cap",
        type=int,
        default=None,
        help="oracle cap in tokens (default: --max-draft-tokens)",
    )
    replay.add_argument(
        "--oracle-scope",
        choices=["call", "session", "run"],
        default="session",
        help="text the oracle may copy from besides artifacts and global corpus",
    )
    replay.add_argument(
        "--global-split",
        choices=["two-fold", "none"],
        default="two-fold",
        help="how the global corpus is drawn from other sessions",
    )
    replay.add_argument(
        "--global-prompts",
        action="store_true",
        help="put the other fold's prompts in the global corpus too",
    )
    replay.add_argument("--tokenizer", default="qwen2.5", help="tokenizer name (default qwen2.5)")
    replay.add_argument(
        "--decode-step-ms",
        type=float,
        default=None,
        help="absolute time of one decode step (default: the cost model's)",
    )
    replay.add_argument(
        "--jobs", type=int, default=1, help="replays run in parallel processes (default 1)"
    )
    replay.add_argument(
        "--caps",
        default=None,
        help="caps file from `agspec profile` for the AgSpec drafters (default: built-in cap)",
    )
    replay.add_argument("--no-steps", action="store_true", help="do not write per-step records")
    replay.add_argument(
        "--steady-state",
        action="store_true",
        help="B > 1: keep every slot busy until the last session ends, with filler replays "
        "on servers of their own (docs/replay.md)",
    )
    replay.add_argument("--no-plots", action="store_true", help="do not write plots")
    replay.add_argument("--no-progress", action="store_true", help="no progress bars")
    replay.add_argument(
        "--ladder", nargs="*", default=None, help="drafters of the ablation ladder plot, in order"
    )
    replay.set_defaults(func=_replay)

    report = subparsers.add_parser("report", help="tables and plots from replay run folders")
    report.add_argument("runs", nargs="+", help="run folders written by agspec replay")
    report.add_argument("--plots", default=None, help="write plots into this folder")
    report.add_argument(
        "--ladder", nargs="*", default=None, help="drafters of the ablation ladder plot, in order"
    )
    report.add_argument("--agents", action="store_true", help="also print accept length per agent")
    report.add_argument("--markdown", action="store_true", help="markdown tables, one per source")
    report.add_argument(
        "--trees",
        action="store_true",
        help="also print tree nodes per step, accepted path and later-branch wins (docs/trees.md)",
    )
    report.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="show the entries of a run folder without complete.json (interrupted, failed "
        "or running), flagged; by default such a folder is an error",
    )
    report.set_defaults(func=_report)


def _replay(args: argparse.Namespace) -> int:
    from agspec.lab.registry import drafter_names
    from agspec.lab.report import format_table
    from agspec.lab.run import (
        RunConfig,
        load_sessions,
        mark_run_complete,
        resolve_cost_model,
        run_replay,
    )
    from agspec.tokenizers import get_tokenizer

    drafters = tuple(args.drafters) if args.drafters else tuple(drafter_names())
    config = RunConfig(
        drafters=drafters,
        batch_sizes=tuple(args.batch_size),
        cost_model=args.cost_model,
        max_draft_tokens=args.max_draft_tokens,
        batch_cost=args.batch_cost,
        oracle_cap_tokens=args.oracle_cap or args.max_draft_tokens,
        oracle_scope=args.oracle_scope,
        global_split=args.global_split,
        global_prompts=args.global_prompts,
        tokenizer=args.tokenizer,
        limit_sessions=args.limit_sessions,
        decode_step_ms=args.decode_step_ms,
        traces=tuple(args.traces),
        write_steps=not args.no_steps,
        steady_state=args.steady_state,
        extra={"caps": args.caps} if args.caps else {},
    )
    # Every argument is checked before the traces load: a misspelt cost model fails at once
    # and leaves no run folder.
    resolve_cost_model(args.cost_model, context_tokens=1024)
    caps = None
    if args.caps:
        from agspec.policy.caps import ProfiledCap

        caps = ProfiledCap.load(args.caps)
    tokenizer = get_tokenizer(args.tokenizer)
    t0 = time.perf_counter()
    sessions = load_sessions(args.traces, tokenizer, limit_sessions=args.limit_sessions)
    print(
        f"loaded {len(sessions)} sessions, "
        f"{sum(s.num_output_tokens for s in sessions):,} output tokens "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    entries = run_replay(
        sessions,
        config,
        args.out,
        tokenizer=tokenizer,
        progress=not args.no_progress,
        jobs=args.jobs,
        mark_complete=False,
        caps=caps,
    )
    print(f"split: {config.split_description()}")
    print(format_table(entries))
    if not args.no_plots:
        from agspec.lab.plots import write_plots

        write_plots(entries, args.out, ladder=args.ladder)
    mark_run_complete(args.out)  # last: the folder is a finished run from here on
    print(f"run folder: {args.out}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    from agspec.lab.report import (
        format_agent_table,
        format_markdown,
        format_table,
        format_tree_table,
        load_entries,
    )

    entries = load_entries(args.runs, allow_incomplete=args.allow_incomplete)
    for run in dict.fromkeys(e["run"] for e in entries if e.get("incomplete")):
        n = sum(1 for e in entries if e["run"] == run)
        print(f"!! INCOMPLETE RUN {run}: {n} entries so far; its figures are partial")
    print(format_markdown(entries) if args.markdown else format_table(entries))
    if args.trees:
        print()
        print(format_tree_table(entries))
    if args.agents:
        for b in sorted({e["batch_size"] for e in entries}):
            print()
            print(f"mean accept length per agent, B={b}")
            print(format_agent_table(entries, batch_size=b))
    if args.plots:
        from agspec.lab.plots import write_plots

        for path in write_plots(entries, args.plots, ladder=args.ladder):
            print(f"wrote {path}", file=sys.stderr)
    return 0
