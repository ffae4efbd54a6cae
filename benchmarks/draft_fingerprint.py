"""A fingerprint of every draft AgSpec makes on real sessions, to prove a refactor moved
nothing: for each dev source and variant, a greedy replay of the first sessions (a draft
is accepted up to the first token that differs from the recorded output), hashing every
step's draft, source and match length. Run it on two checkouts and compare the lines.

    python benchmarks/draft_fingerprint.py --sessions 5 -o fingerprint.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from devtraces import DIRS, dev_sessions, global_docs

from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter.protocol import greedy_commit
from agspec.policy.costmodel import get_cost_model
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call

DEFAULT_VARIANTS = [
    "agspec-paper",
    "agspec",
    "agspec-paper-request-only",
    "agspec-paper-session",
    "agspec-paper+recent+history+cap32",
]


def fingerprint(server: AgSpecServer, sessions, tok) -> tuple[int, str]:
    h = hashlib.sha256()
    steps = 0
    for s in sessions:
        fmt = s.calls[0].emission_format if s.calls else "none"
        sess = server.session(s.session_id, emission_format=fmt)
        for c in s.calls:
            prompt, out = render_call(c, tok)
            for a in c.artifacts:
                if a.text:
                    sess.open_artifact(a.path, a.text)
            d = sess.call(c.agent, c.role, c.turn)
            d.begin(prompt)
            pos = 0
            while pos < len(out):
                draft = d.propose(32)
                h.update(repr((draft, d.last_source, d.last_match_length)).encode())
                _, commit = greedy_commit(draft, out, pos)
                d.accept(commit)
                pos += len(commit)
                steps += 1
            d.end()
        sess.end()
    return steps, h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--global-sessions", type=int, default=24)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    result = {}
    for source in DIRS:
        sessions = dev_sessions(source)
        g = GlobalCorpus.build(
            global_docs(sessions[args.sessions : args.sessions + args.global_sessions], tok)
        )
        for v in args.variants:
            server = AgSpecServer(tokenizer=tok, global_corpus=g, config=VARIANTS[v], cost_model=cm)
            steps, digest = fingerprint(server, sessions[: args.sessions], tok)
            result[f"{source}/{v}"] = {"steps": steps, "sha256_16": digest}
            print(f"{source:<15} {v:<22} {steps:>7} steps  {digest}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
