"""The lab's SuffixDecoding (`suffix-64`) against the same engine driven directly, session
by session interleaved in one process, with the time split by where it goes.

Drive A is the replay lab's `suffix-64` server (`agspec.baselines.suffix`), called as the
simulator calls it. Drive B is arctic-inference's `SuffixDecodingCache` called the way
vLLM's `SuffixDecodingProposer` calls it: `start_request(req_id, prompt as int32 array)`,
then per step `speculate(req_id, last 64 tokens as an int32 view, max_spec_tokens=32,
max_spec_factor=1.0, min_token_prob=0.1)` and `add_active_response(req_id, committed
list)`, `stop_request` at the end. Both get the same global corpus (the other fold's
recorded outputs; drive B serves them first as requests with an empty prompt). Sessions
alternate which drive goes first, so load drift hits both alike.

Reported per drive: tokens/step, and µs per output token in `begin` (the per-request tree
over the prompt), `propose`, `accept`, `end` (freeing that tree; for A also caching the
response) and in total, by the thread's CPU time and by the wall clock.

    python benchmarks/bench_suffix_drive.py traces/swe-agent.jsonl --sessions 30
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import numpy as np

PHASES = ("begin", "propose", "accept", "end")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--sessions", type=int, default=None, help="first N sessions only")
    a = ap.parse_args(argv)
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from agspec.baselines.registry import make_family
    from agspec.drafter.protocol import greedy_commit
    from agspec.lab.run import fold_of, global_docs_by_fold, load_sessions
    from agspec.tokenizers import get_tokenizer

    every = load_sessions([a.trace], get_tokenizer("qwen2.5"))
    docs = global_docs_by_fold(every, include_prompts=False)
    sessions = every[: a.sessions] if a.sessions else every
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    spent: dict[str, dict[str, list[int]]] = {
        d: defaultdict(lambda: [0, 0]) for d in ("suffix-64", "SuffixDecodingCache")
    }
    steps = {"suffix-64": 0, "SuffixDecodingCache": 0}
    lab = {f: make_family("suffix-64", global_docs=docs[f]) for f in (0, 1)}
    caches: dict[int, Any] = {}
    for f in (0, 1):
        cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1)
        for i, doc in enumerate(docs[f]):
            cache.start_request(("global", i), np.zeros(0, dtype=np.int32))
            cache.add_active_response(("global", i), doc)
            cache.stop_request(("global", i))
        caches[f] = cache

    def timed(drive: str, phase: str, fn: Any, *args: Any) -> Any:
        w0, c0 = wall(), cpu()
        out = fn(*args)
        c1, w1 = cpu(), wall()
        slot = spent[drive][phase]
        slot[0] += c1 - c0
        slot[1] += w1 - w0
        return out

    def greedy(draft: list[int], out: list[int], pos: int) -> int:
        """How many tokens a greedy verifier commits at `pos` (agspec's one accept rule)."""
        return len(greedy_commit(draft, out, pos)[1])

    def run_lab(s: Any) -> None:
        d = "suffix-64"
        session = lab[fold_of(s.session_id)].session(s.session_id)
        for c in s.calls:
            call = session.call(c.agent, c.role, c.turn)
            timed(d, "begin", call.begin, list(c.prompt_ids))
            pos = 0
            while pos < len(c.output_ids):
                draft = timed(d, "propose", call.propose, 64)
                n = greedy(draft, c.output_ids, pos)
                timed(d, "accept", call.accept, c.output_ids[pos : pos + n])
                pos += n
                steps[d] += 1
            timed(d, "end", call.end)

    def speculate(cache: Any, req: Any, pattern: np.ndarray) -> list[int]:
        draft = cache.speculate(
            req, pattern, max_spec_tokens=32, max_spec_factor=1.0, min_token_prob=0.1
        )
        return list(draft.token_ids)

    def run_cache(s: Any) -> None:
        d = "SuffixDecodingCache"
        cache = caches[fold_of(s.session_id)]
        for i, c in enumerate(s.calls):
            req = (s.session_id, i)
            prompt = np.asarray(c.prompt_ids, dtype=np.int32)
            row = np.zeros(prompt.size + len(c.output_ids) + 1, dtype=np.int32)
            row[: prompt.size] = prompt  # vLLM's token_ids_cpu row
            n = prompt.size
            timed(d, "begin", cache.start_request, req, row[:n])
            pos = 0
            while pos < len(c.output_ids):
                pattern = row[max(0, n - 64) : n]
                draft = timed(d, "propose", speculate, cache, req, pattern)
                k = greedy(draft, c.output_ids, pos)
                ids = c.output_ids[pos : pos + k]
                timed(d, "accept", cache.add_active_response, req, ids)
                row[n : n + k] = ids
                n += k
                pos += k
                steps[d] += 1
            timed(d, "end", cache.stop_request, req)

    tokens = 0
    for i, s in enumerate(sessions):
        tokens += s.num_output_tokens
        for run in (run_lab, run_cache) if i % 2 else (run_cache, run_lab):
            run(s)
    print(f"{a.trace}: {len(sessions)} sessions, {tokens:,} output tokens")
    for d, phases in spent.items():
        for k, name in enumerate(("CPU", "wall")):
            parts = " ".join(f"{p} {phases[p][k] / 1e3 / tokens:.1f}" for p in PHASES)
            total = sum(phases[p][k] for p in PHASES) / 1e3 / tokens
            print(
                f"  {d:20s} tok/step {tokens / steps[d]:.3f}  {name:4s} us/token: {parts}"
                f"  total {total:.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
