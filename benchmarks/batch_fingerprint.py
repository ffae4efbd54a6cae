"""A fingerprint of every draft `step_batch` makes when many requests share a step, to
prove a change to the batched path moved nothing: B slots replay real calls of the dev
traces in lockstep (greedy: a draft is accepted up to the first token that differs from
the recorded output), and every step's drafts are hashed with the sources and match
lengths. `draft_fingerprint.py` covers the one-request path; this covers the batch
(the cost rule at batch size > 1 prices a draft at its share of the batch's step).
Run it on two checkouts and compare the lines.

    python benchmarks/batch_fingerprint.py --sessions 12 --batch-sizes 1 8 64
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from devtraces import DIRS, begin_call, dev_sessions, global_docs

from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer, step_batch
from agspec.drafter.protocol import greedy_commit
from agspec.policy.costmodel import get_cost_model
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call

DEFAULT_VARIANTS = [
    "agspec-paper",
    "agspec",
    "agspec-paper+cost",
    "agspec-paper+recent+history+cap32",
]


def fingerprint(server: AgSpecServer, sessions, tok, batch: int, max_draft: int):
    """(request-steps, committed tokens, digest) of a lockstep replay with `batch` slots."""
    h = hashlib.sha256()
    queue = [(s, [(c, *render_call(c, tok)) for c in s.calls]) for s in sessions]
    queue = [(s, [x for x in calls if x[2]]) for s, calls in queue]
    queue = [q for q in queue if q[1]]
    queue.reverse()
    slots: list[list] = []  # [call, output, position, committed, session, rest]

    def start(sess_obj, calls):
        c, prompt, out = calls[0]
        d = begin_call(server, sess_obj.session_id, c, prompt)
        return [d, out, 0, None, sess_obj, calls[1:]]

    while queue and len(slots) < batch:
        slots.append(start(*queue.pop()))
    steps = tokens = 0
    while slots:
        drafts = step_batch([x[0] for x in slots], [x[3] for x in slots], max_draft)
        nxt = []
        for x, draft in zip(slots, drafts):
            d, out, pos = x[0], x[1], x[2]
            h.update(repr((draft, d.last_source, d.last_match_length)).encode())
            _, commit = greedy_commit(draft, out, pos)
            steps += 1
            tokens += len(commit)
            x[2], x[3] = pos + len(commit), commit
            if x[2] < len(out):
                nxt.append(x)
                continue
            d.accept(commit)
            d.end()
            if x[5]:
                nxt.append(start(x[4], x[5]))
            else:
                server.end_session(x[4].session_id)
                if queue:
                    nxt.append(start(*queue.pop()))
        slots = nxt
    return steps, tokens, h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=sorted(DIRS), default="swe-agent")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--global-sessions", type=int, default=24)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    sessions = dev_sessions(args.source)
    g = GlobalCorpus.build(
        global_docs(sessions[args.sessions : args.sessions + args.global_sessions], tok)
    )
    result = {}
    for v in args.variants:
        for b in args.batch_sizes:
            server = AgSpecServer(
                tokenizer=tok, global_corpus=g, config=VARIANTS[v], cost_model=cm, batch_size=b
            )
            steps, tokens, digest = fingerprint(
                server, sessions[: args.sessions], tok, b, args.max_draft
            )
            result[f"{v}/B={b}"] = {"steps": steps, "tokens": tokens, "sha256_16": digest}
            print(f"{v:<34} B={b:<4} {steps:>7} steps {tokens:>7} tokens  {digest}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
