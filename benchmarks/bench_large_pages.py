"""The index's large arrays on 2 MB pages against 4 KB pages, in one process.

Builds a 10M-token global corpus (`devtraces.global_docs`) twice, frozen (as a served
global is): once with its large arrays advised for 2 MB pages (cpp/index/large_pages.h)
and once without (`_native.set_large_pages(False)` while it is built). Then, at sampled
positions of the first 20 sessions' outputs, the two in turn at each position: a cursor
fed the 64 tokens before the position, and its `continuation(16, rule)` for the `recent`
and `frequent` rules. The two indexes must
give the same drafts (exits non-zero otherwise). Printed per round for each: µs per query
and its parts (the cursor, the two continuations); and how much of the process's memory
the kernel put on 2 MB pages.

    python benchmarks/bench_large_pages.py --positions 3000 --rounds 10
"""

from __future__ import annotations

import argparse
import gc
import random
import time

import numpy as np
from devtraces import dev_sessions, global_docs

from agspec import _native
from agspec.index.token_index import TokenIndex
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call


def huge_mb() -> float:
    """MB of this process's memory on transparent huge pages (0 where unreadable)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def build(docs: list[np.ndarray], large_pages: bool) -> TokenIndex:
    was = _native.large_pages()
    _native.set_large_pages(large_pages)
    try:
        idx = TokenIndex()
        for d, arr in enumerate(docs):
            idx.extend(d, arr)
        idx.freeze()
    finally:
        _native.set_large_pages(was)
    return idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--positions", type=int, default=3000, help="sampled positions a round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    sessions = dev_sessions("swe-agent")
    replayed, rest = sessions[:20], sessions[20:]
    docs = global_docs(rest, tok, max_tokens=args.global_tokens)
    n = sum(d.size for d in docs)
    base = huge_mb()
    indexes = {"4 KB": build(docs, False)}
    small = huge_mb() - base
    indexes["2 MB"] = build(docs, True)
    print(
        f"global corpus {n:,} tokens, frozen, twice; on 2 MB pages: {small:.0f} MB after the "
        f"4 KB build, {huge_mb() - base:.0f} MB after the 2 MB one"
    )
    outputs = [render_call(c, tok)[1] for s in replayed for c in s.calls]
    places = [(i, p) for i, o in enumerate(outputs) for p in range(64, len(o))]
    rng = random.Random(args.seed)
    clock = time.perf_counter_ns
    names = list(indexes)
    totals = {name: 0 for name in names}
    feeds = {name: 0 for name in names}
    ratios: list[tuple[float, float]] = []  # 2 MB / 4 KB per round: query, continuations
    conts = {name: 0 for name in names}
    print(
        "round  "
        + "  ".join(f"{name + ': query = cursor + continuations':>24}" for name in names)
        + "  (µs)"
    )
    # A garbage collection falls at the same allocation every run, hence on one side of
    # the same position: none while timing.
    gc.disable()
    for r in range(args.rounds):
        sample = rng.sample(places, min(args.positions, len(places)))
        tails = [outputs[i][p - 64 : p] for i, p in sample]
        # Position by position, the two in turn (which goes first alternates): the host's
        # slow spells, which last from milliseconds to seconds, fall on both alike.
        ns_feed = dict.fromkeys(names, 0)
        ns_cont = dict.fromkeys(names, 0)
        drafts: dict[str, list] = {name: [] for name in names}
        for j, tail in enumerate(tails):
            for name in names if j % 2 == 0 else names[::-1]:
                t0 = clock()
                cur = indexes[name].match(tail)
                t1 = clock()
                recent = cur.continuation(16, "recent")
                frequent = cur.continuation(16, "frequent", max_occurrences=32)
                t2 = clock()
                ns_feed[name] += t1 - t0
                ns_cont[name] += t2 - t1
                drafts[name].append((recent, frequent))
        ns = {name: ns_feed[name] + ns_cont[name] for name in names}
        if drafts[names[0]] != drafts[names[1]]:
            raise SystemExit(f"round {r + 1}: the two indexes gave different drafts")
        for name in names:
            totals[name] += ns[name]
            feeds[name] += ns_feed[name]
            conts[name] += ns_cont[name]
        m = len(tails)
        ratios.append((ns[names[1]] / ns[names[0]], ns_cont[names[1]] / ns_cont[names[0]]))
        print(
            f"{r + 1:>5}  "
            + "  ".join(
                f"{ns[x] / 1e3 / m:8.2f} = {ns_feed[x] / 1e3 / m:5.2f} + "
                f"{ns_cont[x] / 1e3 / m:5.2f}"
                for x in names
            )
            + f"  ({ns[names[1]] / ns[names[0]] - 1:+.0%})"
        )
    k = args.rounds * min(args.positions, len(places))
    print(
        "all    "
        + "  ".join(
            f"{totals[x] / 1e3 / k:8.2f} = {feeds[x] / 1e3 / k:5.2f} + {conts[x] / 1e3 / k:5.2f}"
            for x in names
        )
        + f"  ({totals[names[1]] / totals[names[0]] - 1:+.0%}; cursors "
        f"{feeds[names[1]] / feeds[names[0]] - 1:+.0%}, continuations "
        f"{conts[names[1]] / conts[names[0]] - 1:+.0%}); the same drafts in every round"
    )
    # One slow spell can land on one side of a round: the median round says more.
    mid = args.rounds // 2
    print(
        f"median round, 2 MB against 4 KB: query {sorted(q for q, _ in ratios)[mid] - 1:+.0%}, "
        f"continuations {sorted(c for _, c in ratios)[mid] - 1:+.0%}"
    )


if __name__ == "__main__":
    main()
