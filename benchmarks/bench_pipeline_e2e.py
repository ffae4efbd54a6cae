"""The whole multi-agent pipeline, end to end, with and without a drafter.

Records the bundled tasks once per drafter (`agspec record`, one after another on the same
machine: plain decoding first), then compares the runs: wall time, decoding tokens/s per
agent, and where each run's outputs first leave plain decoding's. Greedy speculative
decoding is lossless up to llama.cpp's batched-kernel near-ties, and one flipped token
changes the rest of a session, so for every session that diverges this prints the
one-token logit gap of the two candidates at its first differing token (what
`docs/live.md` calls a near-tie).

    python benchmarks/bench_pipeline_e2e.py --out-dir /tmp/e2e --threads 2 \
        --cost-model src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json

Runs whose trace file is already complete are not recorded again (`agspec record`
resumes), so the comparison can be rerun alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agspec.adapters.llama_cpp import logit_gap


def _live(path: Path) -> dict[str, dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return {rec["session_id"]: rec for rec in map(json.loads, f)}


def record(name: str, args: argparse.Namespace) -> float:
    """`agspec record` for one drafter; returns the wall seconds (0 when already there)."""
    out = Path(args.out_dir) / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "agspec", "record", *args.tasks, "-o", str(out),
           "--drafter", name, "--threads", str(args.threads), "--no-progress"]  # fmt: skip
    if name.startswith("agspec-paper+cost"):
        cmd += ["--cost-model", args.cost_model]
        if args.learn_across_sessions:
            cmd += ["--curves", str(Path(args.out_dir) / f"{name}.curves.json")]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def first_divergences(name: str, args: argparse.Namespace, llm: Any) -> list[dict[str, Any]]:
    from agspec.traces import read_sessions, render_call

    root = Path(args.out_dir)
    base_sessions = {s.session_id: s for s in read_sessions(root / "none.jsonl")}
    base, other = _live(root / "none.live.jsonl"), _live(root / f"{name}.live.jsonl")
    found = []
    for sid, rec in sorted(other.items()):
        for i, (c, bc) in enumerate(zip(rec["calls"], base[sid]["calls"])):
            a, b = bc["output_ids"], c["output_ids"]
            if a == b:
                continue
            p = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
            row: dict[str, Any] = {"session": sid, "call": i, "token": p}
            if p is not None:
                prompt = list(render_call(base_sessions[sid].calls[i], "qwen2.5")[0])
                row["logit_gap"] = logit_gap(llm, prompt, list(a[:p]), a[p], b[p])
            found.append(row)
            break
    return found


def summary(name: str, args: argparse.Namespace) -> dict[str, Any]:
    live = _live(Path(args.out_dir) / f"{name}.live.jsonl")
    tokens: Counter[str] = Counter()
    decode_ms: Counter[str] = Counter()
    for rec in live.values():
        for c in rec["calls"]:
            tokens[c["agent"]] += len(c["output_ids"])
            decode_ms[c["agent"]] += c["total_ms"] - c["prefill_ms"]
    return {
        "sessions": len(live),
        "wall_s": sum(rec["wall_s"] for rec in live.values()),
        "tok_per_s": {a: 1000.0 * tokens[a] / decode_ms[a] for a in tokens if decode_ms[a] > 0},
        "tokens": dict(tokens),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="*", default=["all"], help="bundled task names (default all)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--drafters", default="none,agspec,agspec-paper+cost")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cost-model", default=None, help="profile for agspec-paper+cost")
    ap.add_argument(
        "--learn-across-sessions",
        action="store_true",
        help="agspec-paper+cost keeps its acceptance curves from session to session (--curves)",
    )
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--out", default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    names = [d for d in args.drafters.split(",") if d]
    if "none" not in names:
        names.insert(0, "none")
    if any(n.startswith("agspec-paper+cost") for n in names) and not args.cost_model:
        ap.error("agspec-paper+cost needs --cost-model (agspec costmodel measure)")
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    for name in names:
        seconds = record(name, args)
        print(f"recorded {name} in {seconds:.0f} s", file=sys.stderr)

    from llama_cpp import Llama

    from agspec.models import resolve_model

    llm = Llama(model_path=str(resolve_model(args.model)), n_ctx=8192, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)  # fmt: skip
    results: dict[str, Any] = {}
    base_wall = None
    print("| drafter | sessions | wall s | x plain | decode tok/s by agent | "
          "sessions that diverge | max logit gap at the first divergence |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in names:
        s = summary(name, args)
        s["divergences"] = [] if name == "none" else first_divergences(name, args, llm)
        results[name] = s
        base_wall = base_wall or s["wall_s"]
        gaps = [d["logit_gap"] for d in s["divergences"] if "logit_gap" in d]
        rates = ", ".join(f"{a} {r:.1f}" for a, r in sorted(s["tok_per_s"].items()))
        print(f"| {name} | {s['sessions']} | {s['wall_s']:.0f} | {base_wall / s['wall_s']:.2f}x "
              f"| {rates} | {len(s['divergences'])} | "
              f"{max(gaps) if gaps else 0.0:.4f} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
