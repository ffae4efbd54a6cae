"""Drafting cost per request-step when an engine steps many requests at once.

Replays B real calls of the dev traces in lockstep (greedy: a draft is accepted up to
the first token that differs from the recorded output), with every corpus on (session,
workspace, history, a 10M-token global corpus), and times only the drafter: either
`step_batch` (one native call moves every request's corpora, one reads every match) or
the same work as `accept` + `propose` per request (with `--trees`, also `accept` +
`propose_tree` per request and `step_batch(..., trees=True)`, each tree verified as a
tree: the drafting cost of token trees, docs/trees.md). Prints µs per request-step for each
batch size, side by side in one run: over the whole run, for its median round, and over
the rounds at the full batch only (the run ends in a drain at smaller batches, whose fixed
per-round costs are shared by fewer requests; a round's figure includes the last `accept`
and `end` of the calls that finished in it), with the share of request-steps those are.

    python benchmarks/bench_step_batch.py --batch-sizes 1 8 64 --global-tokens 10000000
    python benchmarks/bench_step_batch.py --variant agspec --trees --batch-sizes 64
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path

from devtraces import DIRS, begin_call, dev_sessions, global_docs

from agspec import drafter as drafter_mod
from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter.protocol import greedy_commit
from agspec.drafter.tree import tree_commit
from agspec.policy.costmodel import get_cost_model
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call


def load_sessions(source: str, tok, num_sessions: int):
    """(session id, [(call, prompt, output)]) for the first sessions; the rest for global."""
    sessions = dev_sessions(source)
    out = []
    for s in sessions[:num_sessions]:
        calls = []
        for c in s.calls:
            prompt, o = render_call(c, tok)
            if o:
                calls.append((c, prompt, o))
        if calls:
            out.append((s.session_id, calls))
    return out, sessions[num_sessions:]


class Lockstep:
    """B slots, each replaying one session's calls in order (a new session, under a fresh
    id, as soon as one ends), stepped in lockstep until `sessions` are used up: `step()`
    runs one round and returns its drafter time (ns) and request count, None at the end."""

    def __init__(
        self, server: AgSpecServer, sessions, batch: int, max_draft: int, batched: bool | str
    ):
        self.server, self.batch, self.max_draft, self.batched = server, batch, max_draft, batched
        self.tokens = 0
        queue = [(f"{sid}#{k}", calls) for k in range(3) for sid, calls in sessions]
        queue = queue[: max(len(sessions), 2 * batch)]
        queue.reverse()
        self.queue = queue
        # [call drafter, output, position, committed, session id, rest]
        self.slots: list[list] = []
        while queue and len(self.slots) < batch:
            sid, calls = queue.pop()
            self.slots.append(self._start_call(calls, sid))

    def _start_call(self, slot_calls, sid):
        c, prompt, out = slot_calls[0]
        return [begin_call(self.server, sid, c, prompt), out, 0, None, sid, slot_calls[1:]]

    def step(self) -> tuple[int, int, int] | None:
        """(ns in the drafter, requests in the round, ns of it in finishing calls), or None
        when every session was replayed."""
        slots = self.slots
        if not slots:
            return None
        t0 = time.perf_counter_ns()
        if self.batched == "tree-batch":
            drafts = drafter_mod.step_batch(
                [x[0] for x in slots], [x[3] for x in slots], self.max_draft, trees=True
            )
        elif self.batched == "trees":
            drafts = []
            for x in slots:
                if x[3]:
                    x[0].accept(x[3])
                drafts.append(x[0].propose_tree(self.max_draft))
        elif self.batched:
            drafts = drafter_mod.step_batch(
                [x[0] for x in slots], [x[3] for x in slots], self.max_draft
            )
        else:
            drafts = []
            for x in slots:
                if x[3]:
                    x[0].accept(x[3])
                drafts.append(x[0].propose(self.max_draft))
        elapsed = time.perf_counter_ns() - t0
        requests = len(slots)
        finished_ns = 0
        nxt = []
        trees = self.batched in ("trees", "tree-batch")
        for x, draft in zip(slots, drafts):
            d, out, pos = x[0], x[1], x[2]
            if trees:  # a DraftTree (of this checkout or, in ab_step_batch, the other's)
                _, commit, _ = tree_commit(draft, out, pos)
                commit = list(commit)
            else:
                _, commit = greedy_commit(draft, out, pos)
            self.tokens += len(commit)
            x[2], x[3] = pos + len(commit), commit
            if x[2] < len(out):
                nxt.append(x)
                continue
            t0 = time.perf_counter_ns()
            d.accept(commit)
            d.end()
            finished_ns += time.perf_counter_ns() - t0
            if x[5]:  # the session's next call (prompt ingestion is not timed)
                nxt.append(self._start_call(x[5], x[4]))
            else:
                self.server.end_session(x[4])
                if self.queue:
                    sid, calls = self.queue.pop()
                    nxt.append(self._start_call(calls, sid))
        self.slots = nxt
        return elapsed + finished_ns, requests, finished_ns


def run(server: AgSpecServer, sessions, batch: int, max_draft: int, batched: bool | str) -> dict:
    """`Lockstep` run to the end, with its figures."""
    total_ns = steps = 0
    per_step: list[float] = []  # ns per request of each step_batch / propose round
    full_ns = full_steps = 0  # the rounds with every slot filled (`batch` requests)
    lock = Lockstep(server, sessions, batch, max_draft, batched)
    while (r := lock.step()) is not None:
        ns, requests, finished_ns = r
        total_ns += ns
        per_step.append((ns - finished_ns) / requests)
        steps += requests
        if requests == batch:
            full_ns += ns
            full_steps += requests
    per_step.sort()
    return {
        "us_per_request_step": total_ns / 1e3 / max(1, steps),
        # The median round: what a step costs when the host does not take the CPU away
        # (this machine's neighbours stall a few rounds by milliseconds).
        "p50_us_per_request_step": per_step[len(per_step) // 2] / 1e3 if per_step else 0.0,
        "full_batch_us_per_request_step": full_ns / 1e3 / max(1, full_steps),
        "full_batch_share": full_steps / max(1, steps),
        "request_steps": steps,
        "tokens_per_step": lock.tokens / max(1, steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=sorted(DIRS), default="swe-agent")
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--variant", default="agspec-paper")
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--trees", action="store_true", help="also time accept + propose_tree per request"
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["per-call", "step_batch", "trees", "tree-batch"],
        help="time only these modes (default: every mode the flags and checkout allow)",
    )
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    sessions, rest = load_sessions(args.source, tok, args.sessions)
    docs = global_docs(rest, tok, max_tokens=args.global_tokens)
    g = GlobalCorpus.build(docs)
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    has_batch = hasattr(drafter_mod, "step_batch")
    has_tree_batch = has_batch and "trees" in inspect.signature(drafter_mod.step_batch).parameters
    print(
        f"{len(sessions)} sessions, global corpus {g.num_tokens:,} tokens, variant {args.variant}"
    )
    print(
        f"{'B':>4} {'mode':>10} {'µs/request-step':>16} {'p50 round':>10} {'tokens/step':>12} "
        f"{'steps':>8} {'full batch':>10} {'share':>6}"
    )
    results = []
    for b in args.batch_sizes:
        modes: list[bool | str] = [False, True] if has_batch else [False]
        if args.trees:
            modes.append("trees")
            if has_tree_batch:
                modes.append("tree-batch")
        names: dict[bool | str, str] = {
            False: "per-call",
            True: "step_batch",
            "trees": "trees",
            "tree-batch": "tree-batch",
        }
        if args.modes:
            modes = [m for m in modes if names[m] in args.modes]
        for batched in modes:
            server = AgSpecServer(
                tokenizer=tok,
                global_corpus=g,
                config=VARIANTS[args.variant],
                cost_model=cm,
                batch_size=b,
            )
            r = run(server, sessions, b, args.max_draft, batched)
            r |= {"batch_size": b, "mode": names[batched]}
            results.append(r)
            print(
                f"{b:>4} {r['mode']:>10} {r['us_per_request_step']:>16.2f} "
                f"{r['p50_us_per_request_step']:>10.2f} {r['tokens_per_step']:>12.3f} "
                f"{r['request_steps']:>8} {r['full_batch_us_per_request_step']:>10.2f} "
                f"{r['full_batch_share']:>6.0%}"
            )
    if args.out:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
