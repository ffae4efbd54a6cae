"""AgSpec's drafting cost per output token at B = 1, runnable in any checkout since d9e46c3.

The replay of `bench_drafter.py --breakdown` (the first 20 swe-agent dev sessions, the
rest as a 10M-token global corpus, greedy acceptance, max draft 32) without the
suffix-64 run, written against the imports of both the tree before issue 11's redesign
and main, so that `benchmarks/redesign_rounds.sh` can run it in both, alternating. Prints
µs per output token in all and per part (artifacts, call, begin, propose, accept, end).

    python benchmarks/bench_b1_any_tree.py agspec-paper   # in main
    python /path/to/main/benchmarks/bench_b1_any_tree.py agspec   # in d9e46c3 (its name)
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd() / "benchmarks"))
try:  # main
    from devtraces import dev_sessions
except ImportError:  # the tree before the redesign
    import bench_drafter as _bd

    def dev_sessions(fmt):  # type: ignore[no-untyped-def]
        return _bd.import_traces(fmt, [_bd.TRACES / _bd.DIRS[fmt]])[0]


from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer

try:  # main
    from agspec.policy.costmodel import break_even_accept_prob, get_cost_model
except ImportError:  # the tree before the redesign
    from agspec.costmodel import break_even_accept_prob, get_cost_model  # type: ignore
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call

GLOBAL_TOKENS = 10_000_000


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "agspec-paper"
    tok = get_tokenizer("qwen2.5")
    sessions = dev_sessions("swe-agent")
    replayed, rest = sessions[:20], sessions[20:]
    docs: list[np.ndarray] = []
    n = 0
    while n < GLOBAL_TOKENS:  # the other sessions' calls, repeated to the size
        for s in rest:
            for c in s.calls:
                prompt, out = render_call(c, tok)
                docs.append(np.asarray(prompt + out, dtype=np.int32))
                n += docs[-1].size
                if n >= GLOBAL_TOKENS:
                    break
            if n >= GLOBAL_TOKENS:
                break
    g = GlobalCorpus.build(docs)
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    config = replace(VARIANTS[variant], break_even_prob=break_even_accept_prob(cm, 1))
    server = AgSpecServer(tokenizer=tok, global_corpus=g, config=config, cost_model=cm)
    rendered = [[render_call(c, tok) for c in s.calls] for s in replayed]
    parts = dict.fromkeys(("artifacts", "call", "begin", "propose", "accept", "end"), 0)
    clock = time.perf_counter_ns
    out_tokens = steps = 0
    for s, calls in zip(replayed, rendered):
        fmt = s.calls[0].emission_format if s.calls else "none"
        sess = server.session(s.session_id, emission_format=fmt)
        for c, (prompt, out) in zip(s.calls, calls):
            t0 = clock()
            for a in c.artifacts:
                if a.text:
                    sess.open_artifact(a.path, a.text)
            t1 = clock()
            d = sess.call(c.agent, c.role, c.turn)
            t2 = clock()
            d.begin(prompt)
            t3 = clock()
            parts["artifacts"] += t1 - t0
            parts["call"] += t2 - t1
            parts["begin"] += t3 - t2
            pos = 0
            while pos < len(out):
                t0 = clock()
                draft = d.propose(32)
                t1 = clock()
                k = 0
                while k < len(draft) and pos + k < len(out) and draft[k] == out[pos + k]:
                    k += 1
                commit = out[pos : pos + k + 1]
                t2 = clock()
                d.accept(commit)
                t3 = clock()
                parts["propose"] += t1 - t0
                parts["accept"] += t3 - t2
                pos += len(commit)
                steps += 1
            t0 = clock()
            d.end()
            parts["end"] += clock() - t0
            out_tokens += len(out)
        sess.end()
    total = sum(parts.values())
    per_token = total / 1e3 / out_tokens
    print(f"{variant} out_tokens={out_tokens} steps={steps} total µs/out tok={per_token:.2f}")
    for part, ns in parts.items():
        print(f"  {part:10s} {ns / 1e3 / out_tokens:6.2f} µs/out tok")


if __name__ == "__main__":
    main()
