"""Drafter overhead per generated token on real sessions, AgSpec vs SuffixDecoding.

Counts everything the drafter does for a call: artifact indexing, prompt ingestion
(`begin`), every `propose` and `accept`; divided by the call's output tokens. Both
drafters replay the same sessions greedily (accept = longest common prefix with the
recorded output) in one run, side by side.

    python benchmarks/bench_drafter.py --source swe-agent --sessions 20 --global-tokens 10000000

`--breakdown` times AgSpec alone, part by part (artifacts, begin, propose, accept, end)
and its continuation calls per corpus.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from devtraces import DIRS, dev_sessions, global_docs

from agspec.baselines.registry import make_family
from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.lab.greedy import greedy_replay
from agspec.policy.costmodel import break_even_accept_prob, get_cost_model
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call


def replay(server, sessions, tok, max_draft: int, phases: dict[str, int] | None = None):
    """Returns (step times in µs, total drafter ns, output tokens, mean accept length);
    `phases` (if given) sums the ns of each part: artifacts, begin, propose, accept, end."""
    steps_us: list[float] = []
    total_ns = out_tokens = accepted = n_steps = 0
    ph = phases if phases is not None else {}
    for k in ("artifacts", "begin", "propose", "accept", "end"):
        ph.setdefault(k, 0)
    for s in sessions:
        fmt = s.calls[0].emission_format if s.calls else "none"
        sess = server.session(s.session_id, emission_format=fmt)
        for c in s.calls:
            prompt, out = render_call(c, tok)
            t0 = time.perf_counter_ns()
            for a in c.artifacts:
                if a.text:
                    sess.open_artifact(a.path, a.text)
            t1 = time.perf_counter_ns()
            d = sess.call(c.agent, c.role, c.turn)
            d.begin(prompt)
            t2 = time.perf_counter_ns()
            total_ns += t2 - t0
            ph["artifacts"] += t1 - t0
            ph["begin"] += t2 - t1
            g = greedy_replay(d, out, max_draft, clock=time.perf_counter_ns)
            steps_us += [step / 1e3 for step in g.step_times]
            total_ns += int(g.propose_time + g.accept_time)
            ph["propose"] += int(g.propose_time)
            ph["accept"] += int(g.accept_time)
            accepted += g.accepted_tokens
            n_steps += g.steps
            t0 = time.perf_counter_ns()
            d.end()
            t1 = time.perf_counter_ns()
            ph["end"] += t1 - t0
            total_ns += t1 - t0
            out_tokens += len(out)
        sess.end()
    return steps_us, total_ns, out_tokens, accepted / max(1, n_steps)


def timed_continuations() -> dict[tuple[str, str], list[int]]:
    """Wraps `CorpusSet.continuation` to count and time the calls per (corpus, rule):
    what the `propose` part spends copying drafts (for --breakdown)."""
    from agspec.corpora.corpus_set import CorpusSet

    timings: dict[tuple[str, str], list[int]] = {}
    inner = CorpusSet.continuation

    def timed(self, slot, max_tokens, *, max_occurrences=32):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter_ns()
        out = inner(self, slot, max_tokens, max_occurrences=max_occurrences)
        entry = timings.setdefault((self.names[slot], self._rules[slot]), [0, 0])
        entry[0] += 1
        entry[1] += time.perf_counter_ns() - t0
        return out

    CorpusSet.continuation = timed  # type: ignore[method-assign]
    return timings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=sorted(DIRS), default="swe-agent")
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--max-draft", type=int, default=32)
    ap.add_argument(
        "--variant", default="agspec-paper", help="AgSpec variant (agspec.drafter.VARIANTS)"
    )
    ap.add_argument(
        "--cost-model",
        default="h200-qwen2.5-32b",
        help="cost model whose p* (at batch 1) the AgSpec length policy uses",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="AgSpec only: µs per output token of each part (artifacts, begin, propose, "
        "accept, end) and the continuation calls per corpus",
    )
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    fmt = args.source
    sessions = dev_sessions(fmt)
    replayed, rest = sessions[: args.sessions], sessions[args.sessions :]
    # Global corpus: the other sessions' calls (prompt + output), repeated to the size asked.
    docs = global_docs(rest, tok, max_tokens=args.global_tokens)
    t0 = time.perf_counter()
    g = GlobalCorpus.build(docs)
    build_s = time.perf_counter() - t0
    print(
        f"global corpus: {g.num_tokens:,} tokens built in {build_s:.1f} s "
        f"({g.num_tokens / build_s / 1e6:.2f} M tok/s), {g.index.num_bytes() / 2**20:.0f} MiB"
    )
    results = {}
    cm = get_cost_model(args.cost_model, context_tokens=16384)
    config = replace(VARIANTS[args.variant], break_even_prob=break_even_accept_prob(cm, 1))
    agspec = AgSpecServer(tokenizer=tok, global_corpus=g, config=config, cost_model=cm)
    if args.breakdown:
        timings = timed_continuations()
        phases: dict[str, int] = {}
        _, total_ns, out_tokens, _ = replay(agspec, replayed, tok, args.max_draft, phases)
        print(f"{args.variant}: {total_ns / 1e3 / out_tokens:.2f} µs per output token")
        for part, ns in phases.items():
            print(f"  {part:<10}{ns / 1e3 / out_tokens:>8.2f}")
        for (corpus, rule), (calls, ns) in sorted(timings.items()):
            each_us = ns / 1e3 / max(1, calls)
            print(
                f"  continuation {corpus} ({rule}): {calls} calls, {each_us:.2f} µs each, "
                f"{ns / 1e3 / out_tokens:.2f} µs per output token"
            )
        return
    suffix = make_family("suffix-64", global_docs=[d.tolist() for d in docs[:2000]], tokenizer=tok)
    for name, server in ((args.variant, agspec), ("suffix-64", suffix)):
        steps, total_ns, out_tokens, acc = replay(server, replayed, tok, args.max_draft)
        results[name] = {
            "us_per_output_token": total_ns / 1e3 / out_tokens,
            "step_p50_us": float(np.percentile(steps, 50)),
            "step_p99_us": float(np.percentile(steps, 99)),
            "mean_accept_length": acc,
            "output_tokens": out_tokens,
        }
    print(f"{'drafter':<12}{'µs/out tok':>12}{'step p50 µs':>13}{'step p99 µs':>13}{'accept':>8}")
    for name, r in results.items():
        print(
            f"{name:<12}{r['us_per_output_token']:>12.2f}{r['step_p50_us']:>13.2f}"
            f"{r['step_p99_us']:>13.2f}{r['mean_accept_length']:>8.3f}"
        )
    print(
        "note: suffix-64's global tree holds the first 2000 documents only (its build is slow);"
        " AgSpec's holds all of them."
    )
    if args.out:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
