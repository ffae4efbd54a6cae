"""Where the batched tree step's time goes: `bench_step_batch.py`'s tree-batch run (B
slots of swe-agent calls in lockstep, a 10M-token global corpus) with the parts of
`step_batch(..., trees=True)` timed call by call, and the garbage collector's passes
counted and timed (it stays on, as in `bench_step_batch.py`). Prints µs per
request-step of each part; a part inside another is counted in both, and each timed
call adds its timer's overhead (well under a microsecond a call), so read the shares,
not the sum.

    python benchmarks/tree_step_parts.py --batch-size 64
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections import Counter
from typing import Any

import bench_step_batch as bsb
from devtraces import global_docs

from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter import batch as batch_mod
from agspec.drafter.call import AgSpecCall
from agspec.policy.costmodel import get_cost_model
from agspec.tokenizers import get_tokenizer

# (module or class, attribute): the parts timed, in the order printed.
PARTS: list[tuple[Any, str]] = [
    (batch_mod, "step_batch"),
    (batch_mod, "_propose"),
    (batch_mod, "_grow_trees"),
    (batch_mod, "match_picks_flat"),
    (batch_mod, "_begin_trees"),
    (batch_mod, "begin_tree_candidates"),
    (batch_mod, "continuation_batch"),
    (batch_mod, "_grow_native"),
    (batch_mod, "grow_begun_trees"),
    (AgSpecCall, "tree_curve"),
    (batch_mod, "match_lengths_flat"),
    (batch_mod, "tree_candidates"),
    (batch_mod, "candidate_tries_flat"),
    (batch_mod, "size_flat_tries_at_prices"),
    (AgSpecCall, "adopt_tree"),
    (AgSpecCall, "take_committed"),
    (AgSpecCall, "_tree_path"),
    (batch_mod, "advance_batch_begin"),
    (batch_mod, "prepare_batch"),
]


def timed(fn, name: str, ns: Counter[str], calls: Counter[str]):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            ns[name] += time.perf_counter_ns() - t0
            calls[name] += 1

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--variant", default="agspec")
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    sessions, rest = bsb.load_sessions("swe-agent", tok, args.sessions)
    g = GlobalCorpus.build(global_docs(rest, tok, max_tokens=args.global_tokens))
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    ns: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for owner, attr in PARTS:
        if hasattr(owner, attr):  # another checkout may lack a part (or name it apart)
            setattr(owner, attr, timed(getattr(owner, attr), attr, ns, calls))
    older = {"candidate_tries": "candidate_tries_flat", "match_lengths_batch": "match_lengths_flat"}
    for name, part in older.items():  # what an older checkout's tree step calls them
        if not hasattr(batch_mod, part) and hasattr(batch_mod, name):
            setattr(batch_mod, name, timed(getattr(batch_mod, name), part, ns, calls))
    # The advance's two halves: the window between advance_batch_begin and its finish()
    # (the caller's policy work, the helpers moving cursors) and finish() itself (the
    # cursors left, then the appends).
    begin = batch_mod.advance_batch_begin

    def advance_begun(*args, **kwargs):
        finish = begin(*args, **kwargs)
        t0 = time.perf_counter_ns()

        def finished():
            t1 = time.perf_counter_ns()
            ns["advance window"] += t1 - t0
            try:
                return finish()
            finally:
                ns["advance finish"] += time.perf_counter_ns() - t1
                calls["advance window"] += 1
                calls["advance finish"] += 1

        return finished

    batch_mod.advance_batch_begin = advance_begun
    bsb.drafter_mod.step_batch = batch_mod.step_batch  # type: ignore[attr-defined]
    gc_ns: Counter[int] = Counter()
    gc_runs: Counter[int] = Counter()
    started: list[int] = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            gc_ns[info["generation"]] += time.perf_counter_ns() - started[0]
            gc_runs[info["generation"]] += 1

    server = AgSpecServer(
        tokenizer=tok,
        global_corpus=g,
        config=VARIANTS[args.variant],
        cost_model=cm,
        batch_size=args.batch_size,
    )
    gc.collect()
    gc.callbacks.append(on_gc)
    r = bsb.run(server, sessions, args.batch_size, args.max_draft, "tree-batch")
    gc.callbacks.remove(on_gc)
    steps = r["request_steps"]
    print(
        f"B = {args.batch_size}: {r['us_per_request_step']:.2f} µs per request-step "
        f"(median round {r['p50_us_per_request_step']:.2f}), {steps} request-steps, "
        f"{r['tokens_per_step']:.3f} tokens/step"
    )
    print(f"{'part':<24} {'µs/request-step':>16} {'calls':>8}")
    for attr in [attr for _, attr in PARTS] + ["advance window", "advance finish"]:
        print(f"{attr:<24} {ns[attr] / 1e3 / steps:>16.2f} {calls[attr]:>8}")
    for gen in range(3):
        print(
            f"{'gc generation ' + str(gen):<24} {gc_ns[gen] / 1e3 / steps:>16.2f} {gc_runs[gen]:>8}"
        )


if __name__ == "__main__":
    main()
