"""Prompt ingestion cost of the session corpus on real sessions, with and without the
known prefix (issue 11 item 3).

Replays every call's rendered prompt (and its recorded answer) of the first sessions of a
dev source into a `SessionCorpus`, three ways, side by side in one run: (1) no hint,
every message hashed again; (2) with `known_tokens` from the session resolver, as the
vLLM proposer and `agspec serve` get it, the resolver's own cost counted too; (3) with
`known_tokens` alone (the corpus's own share). Prints ns per prompt token (CPU time of
this thread, best of `--repeats`) and the tokens each way indexes.

    python benchmarks/bench_ingest.py --source mini-swe-agent --sessions 20
"""

from __future__ import annotations

import argparse
import time

from devtraces import DIRS, dev_sessions

from agspec.corpora import SessionCorpus
from agspec.drafter.session_inference import SessionResolver
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call


def known_prefixes(sessions: list[list[tuple[list[int], list[int]]]]) -> list[list[int]]:
    """The resolver's known tokens for every call (its answer recorded after the call)."""
    out = []
    for calls in sessions:
        resolver = SessionResolver()
        ks = []
        for prompt, answer in calls:
            res = resolver.resolve_tokens(prompt)
            ks.append(res.num_known_units)
            resolver.record_tokens(res, prompt, answer)
        out.append(ks)
    return out


def ingest(sessions, separator: int, knowns, with_resolver: bool) -> tuple[int, int]:
    """(CPU ns, tokens indexed) for ingesting every prompt of every session."""
    added = 0
    t0 = time.thread_time_ns()
    for s, calls in enumerate(sessions):
        corpus = SessionCorpus(separator_id=separator)
        resolver = SessionResolver() if with_resolver else None
        for i, (prompt, answer) in enumerate(calls):
            known = 0
            if resolver is not None:
                res = resolver.resolve_tokens(prompt)
                known = res.num_known_units
            elif knowns is not None:
                known = knowns[s][i]
            added += corpus.add_prompt(i, prompt, known_tokens=known if corpus.num_tokens else 0)
            corpus.add_output(i, answer)  # the answer, as the drafter appends it
            if resolver is not None:
                resolver.record_tokens(res, prompt, answer)
    return time.thread_time_ns() - t0, added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=sorted(DIRS), default="mini-swe-agent")
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tok = get_tokenizer("qwen2.5")
    raw = dev_sessions(args.source)
    sessions = [
        [(p, o) for p, o in (render_call(c, tok) for c in s.calls)] for s in raw[: args.sessions]
    ]
    num_prompt = sum(len(p) for calls in sessions for p, _ in calls)
    knowns = known_prefixes(sessions)
    ways = {
        "no hint": (None, False),
        "resolver + known_tokens": (None, True),
        "known_tokens only": (knowns, False),
    }
    best: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for name, (ks, with_resolver) in ways.items():
            ns, added = ingest(sessions, tok.im_start_id, ks, with_resolver)
            if name not in best or ns < best[name][0]:
                best[name] = (ns, added)
    print(f"{args.source}: {len(sessions)} sessions, {num_prompt:,} prompt tokens")
    print(f"{'way':<26}{'ns/prompt token':>16}{'tokens indexed':>16}")
    for name, (ns, added) in best.items():
        print(f"{name:<26}{ns / num_prompt:>16.2f}{added:>16,}")


if __name__ == "__main__":
    main()
