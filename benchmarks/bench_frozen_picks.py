"""A frozen index's frequent picks against the same index live, on real text.

Builds a 10M-token global corpus (`devtraces.global_docs`: the swe-agent dev sessions
after the first 20, repeated to the size) twice: frozen (`freeze()` builds every state's
`frequent` pick at 32 occurrences) and live (each query computes its pick). Then, at
sampled positions of the first 20 sessions' outputs, a cursor fed the 64 tokens before
the position asks both for `continuation(16, "frequent", max_occurrences=32)`: the drafts
must be the same, and the time per call of each is printed (first queries: the live
index computes every answer afresh, as the frozen one did before its picks). Also prints
how long `freeze()` took and the picks' size (4 bytes a state).

    python benchmarks/bench_frozen_picks.py --positions 5000
"""

from __future__ import annotations

import argparse
import random
import time

from devtraces import dev_sessions, global_docs

from agspec.index.token_index import TokenIndex
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--positions", type=int, default=5000, help="sampled query positions")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    sessions = dev_sessions("swe-agent")
    replayed, rest = sessions[:20], sessions[20:]
    frozen, live = TokenIndex(), TokenIndex()
    docs = global_docs(rest, tok, max_tokens=args.global_tokens)
    for doc, arr in enumerate(docs):
        frozen.extend(doc, arr)
        live.extend(doc, arr)
    n = sum(d.size for d in docs)
    before = frozen.num_bytes()
    t0 = time.perf_counter()
    frozen.freeze()
    freeze_s = time.perf_counter() - t0
    states = frozen._native.num_states()
    print(
        f"global corpus {n:,} tokens, {states:,} states; freeze() {freeze_s:.2f} s; the picks "
        f"{4 * states / 1e6:.1f} MB (num_bytes {before / 1e6:.1f} -> "
        f"{frozen.num_bytes() / 1e6:.1f} MB: freeze also drops the live index's copy of each "
        "position's token)"
    )
    outputs = [render_call(c, tok)[1] for s in replayed for c in s.calls]
    places = [(i, p) for i, o in enumerate(outputs) for p in range(64, len(o))]
    rng = random.Random(args.seed)
    sample = rng.sample(places, min(args.positions, len(places)))
    clock = time.perf_counter_ns
    same = drafted = 0
    ns = {"frozen": 0, "live": 0}
    for i, p in sample:
        tail = outputs[i][p - 64 : p]
        a, b = frozen.match(tail), live.match(tail)
        t0 = clock()
        da = a.continuation(16, "frequent", max_occurrences=32)
        t1 = clock()
        db = b.continuation(16, "frequent", max_occurrences=32)
        t2 = clock()
        ns["frozen"] += t1 - t0
        ns["live"] += t2 - t1
        same += da == db
        drafted += bool(da)
    k = len(sample)
    print(f"{k} positions, {drafted} with a draft: the same draft at {same} of {k}")
    print(
        f"continuation(16, frequent, 32), µs per call: frozen {ns['frozen'] / 1e3 / k:.2f}, "
        f"live {ns['live'] / 1e3 / k:.2f}"
    )
    if same != k:
        raise SystemExit("the frozen index's picks differ from the live index's answers")


if __name__ == "__main__":
    main()
