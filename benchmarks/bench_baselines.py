"""Baselines and AgSpec variants on real sessions: tokens/step and drafting time, batch 1.

Replays every session of each source sequentially, one call at a time, with greedy
acceptance (the longest common prefix of the draft and the recorded output, plus the
bonus token), for each drafter named on the command line: a baseline family of
`agspec.baselines.registry.make_family` (`suffix-64`, `suffix-64-local`, ...) or an AgSpec
variant of `agspec.drafter.VARIANTS` (`agspec`, `agspec-paper-on-suffix-tree`, ...); `NAME@D`
sets the suffix-tree engine's depth to D for that drafter (default: the engine's 64).

Global corpus: the replay lab's two-fold split (`agspec.lab.run.fold_of`): a session is
replayed by a server whose global corpus is the recorded outputs of the other fold's
sessions, so it never holds the session itself. Families that cache earlier responses
(SuffixDecoding's global tree) also add, when each call ends, the responses of the
same-fold sessions replayed before it; `suffix-64-local` keeps none.

Reported per source and drafter: tokens/step (output tokens / steps = mean accept length
+ 1), mean accept length (accepted draft tokens per step, bonus token excluded), drafted
tokens per step, and drafting µs per output token (CPU time in `open_artifact`, `begin`,
`propose`, `accept` and `end`, divided by output tokens; the thread's CPU time, as the
replay lab measures it since issue 15 (before: the wall clock); server construction excluded
and reported apart as build seconds).

    python benchmarks/bench_baselines.py --sources swe-agent chatdev \\
        --drafters suffix-64 suffix-64-local agspec-paper agspec-paper-on-suffix-tree

`--traces-dir DIR` reads `DIR/<source>.jsonl` made by `agspec traces import` (e.g.
`agspec traces import swe-agent ../shared/data/traces/swe-agent-java -o DIR/swe-agent.jsonl`);
without it each source is imported on the fly from `../shared/data/traces`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from agspec.drafter.factory import DrafterContext, DrafterFactory
from agspec.drafter.replay import replay_factory
from agspec.drafter.variants import VARIANTS
from agspec.index.engines import ENGINES
from agspec.lab.greedy import greedy_replay
from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.registry import DRAFTERS
from agspec.lab.run import fold_of, global_docs_by_fold, load_sessions
from agspec.tokenizers import get_tokenizer

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
# source name -> (importer format, folder under TRACES)
SOURCES = {
    "swe-agent": ("swe-agent", "swe-agent-java"),
    "chatdev": ("chatdev", "chatdev"),
    "mini-swe-agent": ("mini-swe-agent", "mini-swe-agent"),
}


def load_source(source: str, traces_dir: Path | None, tokenizer: Any) -> list[ReplaySession]:
    """The source's sessions, tokenized: from `traces_dir` or imported on the fly."""
    if traces_dir is not None:
        path = traces_dir / f"{source}.jsonl"
        if not path.is_file():
            raise SystemExit(f"no {path}: import it with `agspec traces import` first")
        return load_sessions([path], tokenizer)
    from agspec.traces import import_traces, render_call

    fmt, folder = SOURCES[source]
    if not (TRACES / folder).is_dir():
        raise SystemExit(f"no traces at {TRACES / folder}; pass --traces-dir")
    sessions, _ = import_traces(fmt, [TRACES / folder])
    out = []
    for s in sessions:
        calls = []
        formats: dict[str, int] = {}
        for c in s.calls:
            prompt, output = render_call(c, tokenizer)
            formats[c.emission_format] = formats.get(c.emission_format, 0) + 1
            artifacts = tuple((a.path, a.text) for a in c.artifacts)
            calls.append(ReplayCall(c.agent, c.role, c.turn, prompt, list(output), artifacts))
        emission = max(formats, key=lambda k: formats[k]) if formats else "none"
        out.append(ReplaySession(s.session_id, tuple(calls), s.source, emission, s.model))
    return out


def replay_session(server: Any, session: ReplaySession, max_draft: int) -> dict[str, int]:
    """Greedy batch-1 replay of one session; counts and drafter nanoseconds."""
    steps = accepted = drafted = out_tokens = 0
    t0 = time.thread_time_ns()
    sess = server.session(session.session_id, emission_format=session.emission_format)
    ns = time.thread_time_ns() - t0
    seen: set[tuple[str, str]] = set()
    for call in session.calls:
        out = call.output_ids
        t0 = time.thread_time_ns()
        for art in call.artifacts:  # opened the first time the session shows that text
            if art not in seen:
                seen.add(art)
                sess.open_artifact(*art)
        d = sess.call(call.agent, call.role, call.turn)
        d.begin(call.prompt_ids)
        ns += time.thread_time_ns() - t0
        g = greedy_replay(d, out, max_draft, clock=time.thread_time_ns)
        ns += int(g.propose_time + g.accept_time)
        steps += g.steps
        accepted += g.accepted_tokens
        drafted += g.drafted_tokens
        t0 = time.thread_time_ns()
        d.end()
        ns += time.thread_time_ns() - t0
        out_tokens += len(out)
    t0 = time.thread_time_ns()
    sess.end()
    ns += time.thread_time_ns() - t0
    return {
        "steps": steps,
        "accepted": accepted,
        "drafted": drafted,
        "output_tokens": out_tokens,
        "draft_ns": ns,
    }


def bench(
    name: str, sessions: Sequence[ReplaySession], tokenizer: Any, max_draft: int
) -> dict[str, Any]:
    """One drafter over one source: a fresh server per fold, sessions in file order.

    `name@D` runs drafter `name` with the suffix-tree engine at tree depth D (matches of
    up to D - 1 tokens, match + draft <= D), e.g. `agspec-paper-on-suffix-tree@96`.
    """
    base, _, depth = name.partition("@")
    factory = DRAFTERS.get(base)
    if depth:
        if base not in VARIANTS:
            raise ValueError(f"{name}: @D sets the suffix-tree depth of an AgSpec variant")
        engine = f"suffix-tree@{int(depth)}"
        if engine not in ENGINES:
            from agspec.index.suffix_tree import SuffixTreeIndex

            ENGINES.register(engine, partial(SuffixTreeIndex, int(depth)), help="bench")
        factory = replay_factory(name, replace(VARIANTS[base], engine=engine))
    return _bench(name, factory, sessions, tokenizer, max_draft)


def _bench(
    name: str,
    factory: DrafterFactory,
    sessions: Sequence[ReplaySession],
    tokenizer: Any,
    max_draft: int,
) -> dict[str, Any]:
    folds = global_docs_by_fold(sessions, include_prompts=False)
    totals = {"steps": 0, "accepted": 0, "drafted": 0, "output_tokens": 0, "draft_ns": 0}
    build_s = 0.0
    for fold in (0, 1):
        mine = [s for s in sessions if fold_of(s.session_id) == fold]
        if not mine:
            continue
        t0 = time.perf_counter()
        server = factory(DrafterContext(global_docs=folds[fold], tokenizer=tokenizer))
        build_s += time.perf_counter() - t0
        for s in mine:
            for k, v in replay_session(server, s, max_draft).items():
                totals[k] += v
    steps = max(totals["steps"], 1)
    out_tokens = max(totals["output_tokens"], 1)
    return {
        "drafter": name,
        "sessions": len(sessions),
        "output_tokens": totals["output_tokens"],
        "steps": totals["steps"],
        "tokens_per_step": totals["output_tokens"] / steps,
        "mean_accept_length": totals["accepted"] / steps,
        "drafted_per_step": totals["drafted"] / steps,
        "draft_us_per_output_token": totals["draft_ns"] / 1e3 / out_tokens,
        "build_s": build_s,
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sources", nargs="+", choices=sorted(SOURCES), default=["swe-agent"])
    ap.add_argument("--drafters", nargs="+", default=["suffix-64", "agspec-paper"])
    ap.add_argument("--traces-dir", type=Path, help="folder of <source>.jsonl (agspec format)")
    ap.add_argument("--limit-sessions", type=int, help="first N sessions of each source")
    ap.add_argument("--max-draft", type=int, default=32, help="tokens asked per propose")
    ap.add_argument("--tokenizer", default="qwen2.5")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.max_draft < 1:
        ap.error("--max-draft must be >= 1")
    tokenizer = get_tokenizer(args.tokenizer)
    results = []
    header = (
        f"{'source':<15}{'drafter':<24}{'sessions':>9}{'out tokens':>11}{'tok/step':>9}"
        f"{'accept':>8}{'drafted':>8}{'µs/out tok':>11}{'build s':>8}"
    )
    print(header, flush=True)
    for source in args.sources:
        sessions = load_source(source, args.traces_dir, tokenizer)
        if args.limit_sessions is not None:
            sessions = sessions[: args.limit_sessions]
        if not sessions:
            print(f"{source}: no sessions", file=sys.stderr)
            continue
        for name in args.drafters:
            r = {"source": source} | bench(name, sessions, tokenizer, args.max_draft)
            results.append(r)
            print(
                f"{source:<15}{name:<24}{r['sessions']:>9}{r['output_tokens']:>11}"
                f"{r['tokens_per_step']:>9.3f}{r['mean_accept_length']:>8.3f}"
                f"{r['drafted_per_step']:>8.2f}{r['draft_us_per_output_token']:>11.2f}"
                f"{r['build_s']:>8.1f}",
                flush=True,
            )
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"out": str(args.out), "traces_dir": str(args.traces_dir)},
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
