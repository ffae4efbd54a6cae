"""How much better a chain could be by choosing among what AgSpec already retrieves.

Replays each source with a drafter (default `agspec-chain`) exactly as `agspec replay`
does at batch size 1 (same servers, global folds and cost model), and at every step also
asks every corpus that matched for the continuation of its most recent, most frequent
and first occurrence (`CorpusSet.continuations`, the candidates a token tree is built
from), each checked against the recorded output. Prints, per source, tokens per step of:

- `drafted`: the chain the drafter drafted (what `agspec replay` reports);
- `today's pick`: the continuation of the corpus the drafter picked, uncut (`--tokens`
  long): what the length rule leaves on the table;
- `best candidate`: the best of all candidates at every step, an upper bound on any rule
  that chooses among them (compare with the `oracle` drafter's tokens per step);
- with `--recent K`, `best with K recent`: the same with the continuations of the K most
  recent occurrences of every matching corpus's match added (a wider candidate family).

    python benchmarks/chain_candidates.py traces/chatdev.jsonl traces/swe-agent.jsonl \\
        traces/mini-swe-agent.jsonl
    python benchmarks/chain_candidates.py traces/chatdev.jsonl --limit-sessions 10 --recent 8
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from tqdm import tqdm

from agspec.drafter.call import TREE_RULES
from agspec.lab.run import RunConfig, fold_of, load_sessions, make_servers, resolve_cost_model
from agspec.lab.simulator import greedy_commit
from agspec.tokenizers import get_tokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="AgSpec-format JSONL traces")
    ap.add_argument("--drafter", default="agspec-chain")
    ap.add_argument("--cost-model", default="h200-qwen2.5-32b")
    ap.add_argument("--tokens", type=int, default=64, help="draft budget (default 64)")
    ap.add_argument("--limit-sessions", type=int, default=None)
    ap.add_argument(
        "--recent",
        type=int,
        default=0,
        help="also the best with the K most recent occurrences of every matching corpus",
    )
    args = ap.parse_args(argv)
    tok = get_tokenizer("qwen2.5")
    try:
        sessions = load_sessions(args.traces, tok, limit_sessions=args.limit_sessions)
        resolve_cost_model(args.cost_model, context_tokens=1024)  # a bad name fails here
        config = RunConfig(drafters=(args.drafter,), batch_sizes=(1,), max_draft_tokens=args.tokens)
    except ValueError as exc:
        ap.error(str(exc))
    if not sessions:
        ap.error("no sessions in the traces given")
    by_source = defaultdict(list)
    for s in sessions:
        by_source[s.source].append(s)
    if args.recent < 0:
        ap.error("--recent must be >= 0")
    wide = f" best with {args.recent} recent |" if args.recent else ""
    print(f"| source | steps | drafted | today's pick | best candidate |{wide} first token wrong |")
    print("|---|---|---|---|---|---|" + ("---|" if args.recent else ""))
    for source, group in by_source.items():
        num_calls = sum(len(s.calls) for s in group)
        context = int(sum(len(c.prompt_ids) for s in group for c in s.calls) / max(num_calls, 1))
        cost_model = resolve_cost_model(args.cost_model, context_tokens=context)
        servers = make_servers(
            args.drafter, group, config, tokenizer=tok, cost_model=cost_model, batch_size=1
        )
        steps = drafted = picked = best = widest = wrong_first = 0
        bar = tqdm(total=sum(len(c.output_ids) for s in group for c in s.calls), desc=source,
                   unit="tok", leave=False, mininterval=0.5)  # fmt: skip
        for session in group:
            dsession = servers[fold_of(session.session_id)].session(
                session.session_id, emission_format=session.emission_format
            )
            seen: set[tuple[str, str]] = set()
            for call in session.calls:
                for artifact in call.artifacts:
                    if artifact not in seen:
                        seen.add(artifact)
                        dsession.open_artifact(artifact[0], artifact[1])
                drafter = dsession.call(call.agent, call.role, call.turn)
                drafter.begin(list(call.prompt_ids))
                out = list(call.output_ids)
                pos = 0
                server = servers[fold_of(session.session_id)]
                indexes = {  # the indexes behind the corpora, by name (--recent)
                    "session": dsession.session_corpus.index,
                    "workspace": dsession.workspace.index,
                    "history": server.history,
                    "global": server.global_corpus.index if server.global_corpus else None,
                }
                while pos < len(out):
                    draft = drafter.propose(args.tokens)
                    accepted, committed = greedy_commit(draft, out, pos)
                    top, own, wide_top = accepted, accepted, accepted
                    corpora = drafter.corpora
                    if corpora is not None:
                        lengths = corpora.match_lengths()
                        slots = [s for s, m in enumerate(lengths) if m > 0 for _ in TREE_RULES]
                        rules = [r for m in lengths if m > 0 for r in TREE_RULES]
                        conts = corpora.continuations(slots, [args.tokens] * len(slots), rules)
                        for cont in conts:
                            if cont:
                                top = max(top, greedy_commit(cont, out, pos)[0])
                        wide_top = top
                        if args.recent:
                            tail = np.asarray(
                                (list(call.prompt_ids) + out[:pos])[-64:], dtype=np.int32
                            )
                            for name, m in zip(corpora.names, lengths):
                                index = indexes.get(name)
                                if m <= 0 or index is None:
                                    continue
                                for doc, end in index.match(tail).occurrences(args.recent):
                                    # end: the match's last token in the document
                                    cont = index.document(doc)[end + 1 : end + 1 + args.tokens]
                                    wide_top = max(wide_top, greedy_commit(cont, out, pos)[0])
                        if drafter.last_source is not None:
                            slot = corpora.names.index(drafter.last_source)
                            uncut = corpora.continuation(slot, args.tokens)
                            own = greedy_commit(uncut, out, pos)[0]
                    # Tokens a step commits: the accepted ones and the model's own next
                    # token, fewer where the output ends (as the lab counts them).
                    left = len(out) - pos
                    steps += 1
                    drafted += len(committed)
                    picked += min(max(own, accepted) + 1, left)
                    best += min(top + 1, left)
                    widest += min(max(top, wide_top) + 1, left)
                    wrong_first += bool(draft) and accepted == 0
                    drafter.accept(committed)
                    pos += len(committed)
                    bar.update(len(committed))
                drafter.end()
            dsession.end()
        bar.close()
        n = max(steps, 1)
        wide_cell = f" {widest / n:.2f} |" if args.recent else ""
        print(
            f"| {source} | {steps:,} | {drafted / n:.2f} | {picked / n:.2f} | "
            f"{best / n:.2f} |{wide_cell} {wrong_first / n:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
