"""`agspec record TASK... -o traces.jsonl`: run the coding pipeline and record its sessions.

Example:

    $ agspec record paginate leap-years -o /tmp/t.jsonl --max-new-tokens 256
    record: 100%|██████████| 2/2 [03:10<00:00, paginate: passed]
    2 recorded, 0 already there: passed 1, failed 1, error 0 -> /tmp/t.jsonl (+ /tmp/t.live.jsonl)

Sessions already in the output are skipped (resume after an interruption).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from agspec.pipeline.runner import SOURCE, CallLive, PipelineConfig, run_session
from agspec.pipeline.tasks import load_task, load_tasks
from agspec.traces.recorder import Recorder

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# The shipped llama.cpp profile of the default model on a 2-core EPYC (docs/costmodel-profiles.md).
DEFAULT_COST_PROFILE = "epyc2t-llamacpp-qwen2.5-coder-0.5b-measured"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "record", help="run the localizer/coder/executor pipeline on tasks and record traces"
    )
    parser.add_argument("tasks", nargs="+", metavar="TASK", help="bundled task names, or all")
    parser.add_argument("-o", "--output", required=True, help="trace file (.jsonl)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="pinned name or GGUF path")
    parser.add_argument(
        "--drafter",
        choices=("agspec", "agspec-paper", "agspec-paper+cost", "none"),
        default="agspec",
        help="agspec (the default: cost-aware lengths from --cost-model, most recent "
        "occurrences, the history corpus); agspec-paper: the paper's method; "
        "agspec-paper+cost: the paper's retrieval with cost-aware lengths; none: plain decoding",
    )
    parser.add_argument(
        "--cost-model",
        default=None,
        help="for the cost-aware drafters (agspec, agspec-paper+cost): a cost profile from "
        "`agspec costmodel measure` (path) or a preset name; default for the default model: "
        f"the shipped profile {DEFAULT_COST_PROFILE}",
    )
    parser.add_argument(
        "--curves",
        default=None,
        help="for the cost-aware drafters: keep their learned acceptance curves in this file, "
        "so each session starts from what the earlier ones learned",
    )
    parser.add_argument("--max-turns", type=int, default=3, help="coder attempts per task")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="per coder call")
    parser.add_argument("--localizer-max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=16, help="draft budget/step")
    parser.add_argument("--test-timeout", type=float, default=30.0, help="seconds per test run")
    parser.add_argument("--n-ctx", type=int, default=8192, help="llama.cpp context size")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_record)


def _record(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agspec.models import resolve_model
    from agspec.pipeline.runner import LlamaLLM

    config = PipelineConfig(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        localizer_max_new_tokens=args.localizer_max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        test_timeout_s=args.test_timeout,
    )
    cost_model = None
    if args.drafter in ("agspec", "agspec-paper+cost"):
        if not args.cost_model and args.model == DEFAULT_MODEL:
            args.cost_model = DEFAULT_COST_PROFILE
        if not args.cost_model:
            raise ValueError(
                f"--drafter {args.drafter} needs --cost-model for --model {args.model} "
                "(measure one with `agspec costmodel measure --model MODEL -o cpu.json "
                "--threads N`), or use --drafter agspec-paper"
            )
        from agspec.lab.run import resolve_cost_model

        cost_model = resolve_cost_model(args.cost_model, context_tokens=args.n_ctx)
    names = load_tasks(args.tasks)
    # Fail fast, before the model loads and before anything is written: an unknown or
    # broken task is a typo to fix, not a session to record as an error.
    for name in names:
        load_task(name)
    recorder = Recorder(args.output)
    todo = [n for n in names if f"{SOURCE}/{n}" not in recorder.done]
    skipped = len(names) - len(todo)
    counts: Counter[str] = Counter()
    if todo:
        path = resolve_model(args.model)
        llm = LlamaLLM(str(path), name=path.stem, n_ctx=args.n_ctx, n_threads=args.threads)
        factory = (
            _agspec_factory(args.drafter, cost_model, args.curves)
            if args.drafter != "none"
            else None
        )
        t0 = time.perf_counter()
        bar = tqdm(todo, desc="record", unit="task", disable=args.no_progress, file=sys.stderr)
        for name in bar:

            def show(live: CallLive, name: str = name) -> None:
                bar.set_postfix_str(
                    f"{name}: call {live.index} {live.agent} {len(live.output_ids)} tokens "
                    f"{live.total_ms / 1000:.0f} s"
                )

            result = run_session(name, llm, server_factory=factory, config=config, on_call=show)
            recorder.write(
                result.session,
                {
                    "task_id": name,
                    "status": result.status,
                    "detail": result.detail,
                    "model": llm.name,
                    "drafter": args.drafter,
                    "config": asdict(config),
                    "observations": [o.status for o in result.observations],
                    "wall_s": round(result.wall_s, 2),
                    "calls": [c.to_dict() for c in result.live],
                },
            )
            counts[result.status] += 1
            bar.set_postfix_str(f"{name}: {result.status}")
        elapsed = time.perf_counter() - t0
        print(f"recording took {elapsed:.0f} s", file=sys.stderr)
    print(
        f"{len(todo)} recorded, {skipped} already there: passed {counts['passed']}, "
        f"failed {counts['failed']}, error {counts['error']} -> {recorder.path} "
        f"(+ {recorder.live_path})"
    )
    return 0


def _agspec_factory(variant: str, cost_model: Any, curves: str | None):  # type: ignore[no-untyped-def]
    from agspec.drafter import AgSpecServer
    from agspec.tokenizers import get_tokenizer

    tokenizer = get_tokenizer("qwen2.5")

    def factory() -> AgSpecServer:
        # As every caller builds it: with a cost model, p* is its break-even probability.
        return AgSpecServer.from_variant(
            variant, tokenizer=tokenizer, cost_model=cost_model, curves_path=curves
        )

    return factory
