"""Live speculative decoding on llama.cpp: tokens/s of AR, llama-cpp-python's own prompt
lookup, and any drafter of the replay registry, side by side in one run, per role.

Real agent calls come from the dev traces (`../shared/data/traces`), rendered with the
Qwen2.5 ChatML template (`agspec.traces.render_call`), so the ids are the ids
Qwen2.5-Coder sees. Before a measured call, the drafter's session sees the session's
earlier calls (artifacts opened, prompt begun, recorded output accepted), as in the
replay lab: that is the session context a retrieval drafter drafts from.

Per call, every method runs back to back on the same warm KV cache (the prompt is
prefilled once; every method re-evaluates only the last prompt token), greedy, and the
wall time of the call's decoding is measured:

- `ar`: stock `Llama.generate`, no draft model;
- `llama-pld`: stock `Llama.generate` with `LlamaPromptLookupDecoding()` (its defaults:
  max_ngram_size 2, num_pred_tokens 10);
- `<drafter>-hook`: stock `Llama.generate` with `AgSpecLlamaDraftModel` fed by the drafter;
- `<drafter>-loop`: `agspec.adapters.llama_cpp.generate` (own loop) with the drafter
  (a drafter with `propose_tree`, AgSpec's, is verified as a token tree, in the Llama's
  tree context, prefilled with the prompt before the call like the Llama's own).

Every method's output is compared with `ar`'s, token for token.

    python benchmarks/bench_live_llama_cpp.py --drafters pld-hf --calls-per-role 3 \
        --out /tmp/live.json

Any name `agspec replay --drafters` accepts works for `--drafters` (AgSpec once the
drafter registers itself there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO.parent / "shared" / "data" / "traces"
SOURCES = {  # format -> folder under the traces root
    "chatdev": "chatdev",
    "swe-agent": "swe-agent-java/deepseek-coder-v2",
    "mini-swe-agent": "mini-swe-agent/gemini-3-pro",
}


def pick_calls(
    traces: Path, roles: list[str], per_role: int, sessions_per_source: int, min_output_tokens: int
) -> list[tuple[Any, int]]:
    """`(session, call_index)` pairs: `per_role` calls of each role, a seeded random
    sample taken round-robin over the sources, whose recorded output has enough tokens."""
    from agspec.traces import import_traces
    from agspec.traces.importers import find_trace_files
    from agspec.traces.render import get_renderer

    renderer = get_renderer("qwen2.5")
    by_source: dict[str, list[tuple[Any, int]]] = {}
    if traces.is_file():  # an AgSpec-format trace file, e.g. the bundled default traces
        from agspec.traces import read_sessions

        sessions = list(read_sessions(traces))[:sessions_per_source]
        by_source["agspec"] = [
            (s, i)
            for s in sessions
            for i, c in enumerate(s.calls)
            if c.role in roles and renderer.count_call(c)[1] >= min_output_tokens
        ]
    for fmt, sub in ({} if traces.is_file() else SOURCES).items():
        folder = traces / sub
        if not folder.is_dir():
            continue
        files = find_trace_files(fmt, [folder])[:sessions_per_source]
        sessions, _skipped = import_traces(fmt, files)
        by_source[fmt] = [
            (s, i)
            for s in sessions
            for i, c in enumerate(s.calls)
            if c.role in roles and renderer.count_call(c)[1] >= min_output_tokens
        ]
    rng = random.Random(0)  # a fixed sample, not the first calls (those have no history)
    for pairs in by_source.values():
        rng.shuffle(pairs)
    picked: list[tuple[Any, int]] = []
    for role in roles:
        queues = [
            [p for p in pairs if p[0].calls[p[1]].role == role] for pairs in by_source.values()
        ]
        taken = 0
        while taken < per_role and any(queues):
            for q in queues:
                if q and taken < per_role:
                    picked.append(q.pop(0))
                    taken += 1
    return picked


def replay_call(drafter: Any, prompt_ids: list[int], output_ids: list[int], k: int) -> None:
    """Run a recorded call through a drafter as greedy verification would: each step
    commits the draft's agreeing prefix plus the next recorded token (the replay lab's
    oracle; no model needed)."""
    drafter.begin(prompt_ids)
    pos = 0
    while pos < len(output_ids):
        draft = drafter.propose(k)
        accepted = 0
        while (
            accepted < len(draft)
            and pos + accepted < len(output_ids) - 1
            and draft[accepted] == output_ids[pos + accepted]
        ):
            accepted += 1
        drafter.accept(output_ids[pos : pos + accepted + 1])
        pos += accepted + 1
    drafter.end()


def warm_session(server: Any, session: Any, index: int, num_draft_tokens: int) -> Any:
    """A drafter session that has seen calls 0..index-1 (recorded outputs) and the
    artifacts of call `index`; returns it ready for call `index`."""
    from agspec.traces import render_call

    ds = server.session(session.session_id, emission_format=session.emission_format)
    for j, call in enumerate(session.calls[: index + 1]):
        for artifact in call.artifacts:
            ds.open_artifact(artifact.path, artifact.text)
        if j == index:
            break
        prompt_ids, output_ids = render_call(call, "qwen2.5", end_token=True)
        drafter = ds.call(call.agent, call.role, call.turn)
        replay_call(drafter, prompt_ids, output_ids, num_draft_tokens)
    return ds


def stock_run(
    llm: Any, prompt: list[int], max_new_tokens: int, stops: set[int]
) -> tuple[list[int], float]:
    """Greedy `Llama.generate` with whatever `llm.draft_model` is; (tokens, seconds)."""
    out: list[int] = []
    t = time.perf_counter()
    for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if token in stops or len(out) >= max_new_tokens:
            break
    return out, time.perf_counter() - t


def first_difference(reference: list[int], got: list[int]) -> int | None:
    """Index of the first differing token (None when equal up to the shorter length)."""
    for i, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            return i
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--drafters", default="pld-hf", help="comma-separated registry names")
    ap.add_argument("--roles", default="code,review,localize,execute,plan")
    ap.add_argument("--calls-per-role", type=int, default=3)
    ap.add_argument("--sessions-per-source", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1536,
        help="keep the last N prompt tokens (CPU prefill is slow)",
    )
    ap.add_argument("--num-draft-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--cost-profile",
        default=None,
        help="agspec-cost-profile JSON for drafters that use a cost model "
        "(from `agspec costmodel measure`)",
    )
    ap.add_argument("--out", default=None, help="write per-call results as JSON")
    args = ap.parse_args(argv)

    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from agspec.adapters.llama_cpp import (
        AgSpecLlamaDraftModel,
        generate,
        import_llama_cpp,
        logit_gap,
        prefill,
    )
    from agspec.adapters.llama_cpp_tree import prefill_tree
    from agspec.lab.registry import make_server
    from agspec.models import resolve_model
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import render_call

    traces = Path(args.traces)
    if not (traces.is_dir() or traces.is_file()):
        print(f"traces folder {traces} not found", file=sys.stderr)
        return 1
    roles = [r for r in args.roles.split(",") if r]
    calls = pick_calls(
        traces,
        roles,
        args.calls_per_role,
        args.sessions_per_source,
        min_output_tokens=args.max_new_tokens // 2,
    )
    llama_cpp = import_llama_cpp()
    n_ctx = args.max_prompt_tokens + args.max_new_tokens + args.num_draft_tokens + 8
    llm = llama_cpp.Llama(
        model_path=str(resolve_model(args.model)), n_ctx=n_ctx, n_batch=512,
        n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, seed=0,
        verbose=False,
    )  # fmt: skip
    eos = llm.token_eos()
    im_end = 151645  # Qwen2.5 <|im_end|>: the chat turn's end
    stops = {eos, im_end}
    tokenizer = get_tokenizer("qwen2.5")
    drafters = [d for d in args.drafters.split(",") if d]

    from agspec.policy.costmodel import ProfileCostModel

    cost_model = None
    if args.cost_profile:
        cost_model = ProfileCostModel.load(args.cost_profile)
    elif any("cost" in d for d in drafters):
        # A drafter that needs the backend's cost profile and none given: measure it here
        # (the same measurement as `agspec costmodel measure`, about half a minute).
        from agspec.adapters.llama_cpp import measure_cost_profile

        print("no --cost-profile: measuring this backend's verification cost", file=sys.stderr)
        profile = measure_cost_profile(
            args.model, max_tokens=args.num_draft_tokens + 1, context_tokens=1024,
            repeats=3, threads=args.threads,
        )  # fmt: skip
        cost_model = ProfileCostModel.from_dict(profile, source="measured by this run")

    def server(name: str) -> Any:
        return make_server(
            name, global_docs=[], tokenizer=tokenizer, cost_model=cost_model, batch_size=1
        )

    rows = []
    print(
        f"{len(calls)} calls; methods: ar, llama-pld, "
        + ", ".join(f"{d}-hook, {d}-loop" for d in drafters),
        file=sys.stderr,
    )
    for session, index in calls:
        call = session.calls[index]
        prompt = render_call(call, "qwen2.5")[0][-args.max_prompt_tokens :]
        llm.reset()
        t = time.perf_counter()
        prefill(llm, prompt, reuse_prefix=False)
        prefill_s = time.perf_counter() - t
        # The own loop verifies AgSpec's token trees in a second context of the same
        # model (agspec.adapters.llama_cpp_tree): prefill it too, untimed, so every
        # method starts on a warm cache.
        prefill_tree(llm, prompt, max_branches=args.num_draft_tokens)
        row: dict[str, Any] = {
            "session": session.session_id,
            "call": index,
            "source": session.source,
            "role": call.role,
            "prompt_tokens": len(prompt),
            "prefill_s": prefill_s,
        }
        llm.draft_model = None
        reference, seconds = stock_run(llm, prompt, args.max_new_tokens, stops)
        row["ar"] = {"tokens": len(reference), "s": seconds}
        outputs: dict[str, list[int]] = {}
        llm.draft_model = LlamaPromptLookupDecoding()
        out, seconds = stock_run(llm, prompt, args.max_new_tokens, stops)
        outputs["llama-pld"] = out
        row["llama-pld"] = {
            "tokens": len(out),
            "s": seconds,
            "same": out == reference,
            "first_diff": first_difference(reference, out),
        }
        for name in drafters:
            ds = warm_session(server(name), session, index, args.num_draft_tokens)
            hook = AgSpecLlamaDraftModel(
                lambda ds=ds, c=call: ds.call(c.agent, c.role, c.turn),
                num_draft_tokens=args.num_draft_tokens,
            )
            llm.draft_model = hook
            out, seconds = stock_run(llm, prompt, args.max_new_tokens, stops)
            hook.finish()
            outputs[f"{name}-hook"] = out
            row[f"{name}-hook"] = {
                "tokens": len(out),
                "s": seconds,
                "same": out == reference,
                "first_diff": first_difference(reference, out),
                "drafted": hook.num_drafted_tokens,
                "accepted": hook.num_accepted_tokens,
            }
            llm.draft_model = None
            ds = warm_session(server(name), session, index, args.num_draft_tokens)
            t = time.perf_counter()
            result = generate(
                llm,
                prompt,
                ds.call(call.agent, call.role, call.turn),
                args.max_new_tokens,
                num_draft_tokens=args.num_draft_tokens,
                eos_token_ids=sorted(stops),
            )
            seconds = time.perf_counter() - t
            outputs[f"{name}-loop"] = result.tokens
            row[f"{name}-loop"] = {
                "tokens": len(result.tokens),
                "s": seconds,
                "same": result.tokens == reference,
                "first_diff": first_difference(reference, result.tokens),
                "steps": len(result.steps),
                "drafted": result.num_drafted_tokens,
                "accepted": result.num_accepted_tokens,
            }
        # Judge each difference from AR: the one-token logit gap of the two candidates at
        # the first differing position (a near-tie flip has a small gap; a bug would not).
        for method, out in outputs.items():
            p = row[method]["first_diff"]
            if p is not None:
                row[method]["flip_logit_gap"] = logit_gap(
                    llm, prompt, reference[:p], reference[p], out[p]
                )
        rows.append(row)
        summary = "  ".join(
            f"{k} {v['tokens'] / v['s']:.1f}" for k, v in row.items() if isinstance(v, dict)
        )
        print(
            f"{session.source:14s} {call.role:8s} p={len(prompt):5d}  tok/s: {summary}",
            file=sys.stderr,
        )

    methods = [k for k, v in rows[0].items() if isinstance(v, dict)] if rows else []
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for role in [*roles, "all"]:
        sel = [r for r in rows if role == "all" or r["role"] == role]
        if not sel:
            continue
        for m in methods:
            tokens = sum(r[m]["tokens"] for r in sel)
            seconds = sum(r[m]["s"] for r in sel)
            table[role][m] = {
                "tok_per_s": tokens / seconds,
                "same_as_ar": sum(1 for r in sel if r[m].get("same", True)),
                "calls": len(sel),
            }
    print("\n| role | calls | " + " | ".join(f"{m} tok/s" for m in methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    for role, per in table.items():
        ar = per["ar"]["tok_per_s"]
        cells = [
            f"{per[m]['tok_per_s']:.1f}"
            + ("" if m == "ar" else f" ({per[m]['tok_per_s'] / ar:.2f}x)")
            for m in methods
        ]
        print(f"| {role} | {per['ar']['calls']} | " + " | ".join(cells) + " |")
    mismatches = {m: sum(1 for r in rows if not r[m].get("same", True)) for m in methods}
    gaps = [r[m]["flip_logit_gap"] for r in rows for m in methods if "flip_logit_gap" in r[m]]
    print(f"\noutputs different from ar: {mismatches}")
    if gaps:
        print(f"one-token logit gap at the first difference: {min(gaps):.4f} .. {max(gaps):.4f}")
    if args.out:
        meta = {
            "model": args.model,
            "threads": args.threads,
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "args": vars(args),
        }
        Path(args.out).write_text(
            json.dumps({"meta": meta, "rows": rows, "table": table}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
