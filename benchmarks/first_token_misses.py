"""At the steps where an AgSpec variant's first draft token is wrong, could any retrieval
have known better? For each such step: is the model's real next token among the top-k
next tokens (by count) after the 32 most recent occurrences of the chosen source's
match, among the top 3 over every live source, or anywhere among those occurrences?

A greedy batch-1 replay of each call (the recorded output is the model), with the
session's artifacts opened, no global corpus.

    python benchmarks/first_token_misses.py traces/chatdev.jsonl --sessions 12

When the real token is not among the occurrences' next tokens at all, no choice among
them (no rule, no draft tree over them) could have drafted it: the model wrote text that
never followed this context in the session.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

LIVE = ("session", "workspace", "history")


def _index(call: Any, source: str) -> Any:
    if source == "session":
        return call.session.session_corpus.index
    if source == "workspace":
        return call.session.workspace.index
    return call.session.server.history


def next_token_counts(call: Any, source: str, cursor: Any, cache: dict) -> Counter[int]:
    """Next token after each of the 32 most recent occurrences of the cursor's match."""
    counts: Counter[int] = Counter()
    for doc, off in cursor.occurrences(32):
        key = (source, doc)
        tokens = cache.get(key)
        if tokens is None or len(tokens) <= off + 1:
            tokens = cache[key] = list(_index(call, source).document(doc))
        if off + 1 < len(tokens):
            counts[tokens[off + 1]] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", help="an AgSpec trace file")
    ap.add_argument("--variant", default="agspec-paper")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--cost-model", default="h200-qwen2.5-32b")
    args = ap.parse_args(argv)

    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.policy.costmodel import get_cost_model
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import read_sessions, render_call

    server = AgSpecServer(
        tokenizer=get_tokenizer("qwen2.5"),
        config=VARIANTS[args.variant],
        cost_model=get_cost_model(args.cost_model),
    )
    stats: Counter[str] = Counter()
    cache: dict[tuple[str, int], list[int]] = {}
    for session in list(read_sessions(args.traces))[: args.sessions]:
        ds = server.session(session.session_id, emission_format=session.emission_format)
        for call in session.calls:
            for artifact in call.artifacts:
                ds.open_artifact(artifact.path, artifact.text)
            prompt, output = render_call(call, "qwen2.5")[:2]
            drafter = ds.call(call.agent, call.role, call.turn)
            drafter.begin(list(prompt))
            cache.clear()  # documents are cached per call (the indexes change between calls)
            out, pos = list(output), 0
            while pos < len(out):
                draft = drafter.propose(64)
                a = 0
                while a < len(draft) and pos + a < len(out) and draft[a] == out[pos + a]:
                    a += 1
                if draft and a == 0 and drafter.last_source in LIVE:
                    stats["steps"] += 1
                    truth = out[pos]
                    cursors = dict(drafter._cursor_items)
                    chosen = next_token_counts(
                        drafter, drafter.last_source, cursors[drafter.last_source], cache
                    )
                    ranked = [t for t, _ in chosen.most_common()]
                    for k in (2, 3):
                        stats[f"top {k}, chosen source"] += truth in ranked[:k]
                    every: Counter[int] = Counter()
                    for source, cursor in cursors.items():
                        if source in LIVE and cursor.match_length > 0:
                            every.update(next_token_counts(drafter, source, cursor, cache))
                    stats["top 3, every source"] += truth in [t for t, _ in every.most_common(3)]
                    stats["anywhere in the occurrences"] += truth in every
                drafter.accept(out[pos : pos + a + 1])
                pos += a + 1
            drafter.end()
    n = stats.pop("steps", 0)
    print(f"{args.traces}: {n} steps whose first draft token was wrong")
    for key, value in stats.items():
        print(f"  real token {key}: {value / max(n, 1):.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
