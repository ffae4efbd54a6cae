"""Replay recorded agent sessions through `agspec serve`, drafting on and off, side by side.

    python -m agspec.serve.bench --traces src/agspec/data/traces/default.jsonl.gz \\
        --sessions 4 --max-tokens 256 --threads 2 -o serve-bench.json

For each drafter (default `none,agspec`) a fresh server starts; every call of the chosen
sessions is sent as an OpenAI chat request with the messages as recorded, in order,
greedy, with no session id: the server finds the sessions itself. The figure is
completion tokens per second of decoding (prefill excluded, from the server's `agspec`
object) per call role, and where the answers differ from `none`'s, the call.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default="src/agspec/data/traces/default.jsonl.gz")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--drafters", default="none,agspec")
    ap.add_argument("--cost-profile", default=None)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)

    import openai

    from agspec.serve.launch import ServerProcess
    from agspec.traces.io import read_sessions

    sessions = list(read_sessions(args.traces))[: args.sessions]
    calls = [(s.session_id, c) for s in sessions for c in s.calls]
    results: dict[str, list[dict[str, Any]]] = {}
    for drafter in args.drafters.split(","):
        cmd = ["--model", args.model, "--threads", str(args.threads), "--n-ctx",
               str(args.n_ctx), "--drafter", drafter]  # fmt: skip
        if args.cost_profile:
            cmd += ["--cost-profile", args.cost_profile]
        rows = []
        with ServerProcess(cmd) as srv:
            client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
            for sid, call in calls:
                messages: Any = [{"role": m.role, "content": m.content} for m in call.messages]
                r = client.chat.completions.create(
                    model=args.model, messages=messages, max_tokens=args.max_tokens,
                    temperature=0, extra_headers={"X-AgSpec-Return-Ids": "1"},
                )  # fmt: skip
                info: dict[str, Any] = (r.model_extra or {})["agspec"]
                assert r.usage is not None
                rows.append({
                    "session": sid, "role": call.role, "agent": call.agent,
                    "tokens": r.usage.completion_tokens, "decode_ms": info["decode_ms"],
                    "prefill_ms": info["prefill_ms"], "drafted": info["drafted_tokens"],
                    "accepted": info["accepted_tokens"], "continued": not info["session_new"],
                    "output_ids": info["output_ids"],
                })  # fmt: skip
                print(f"{drafter}: {sid} {call.role} {rows[-1]['tokens']} tokens "
                      f"{info['decode_ms']:.0f} ms", file=sys.stderr)  # fmt: skip
        results[drafter] = rows
    base = args.drafters.split(",")[0]
    print(f"| role | calls | {' | '.join(results)} |")
    print("|---|---|" + "---|" * len(results))
    by_role: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for name, rows in results.items():
        for row in rows:
            for role in (row["role"], "all"):
                acc = by_role[role][name]
                acc[0] += row["tokens"]
                acc[1] += row["decode_ms"]
    for role, per in sorted(by_role.items(), key=lambda kv: kv[0] == "all"):
        n = sum(1 for row in results[base] if role in (row["role"], "all"))
        tps = {k: 1000 * v[0] / v[1] for k, v in per.items() if v[1] > 0}
        cells = [f"{tps[k]:.1f} ({tps[k] / tps[base]:.2f}x)" for k in results if k in tps]
        print(f"| {role} | {n} | {' | '.join(cells)} |")
    for name, rows in results.items():
        if name == base:
            continue
        differ = sum(a["output_ids"] != b["output_ids"] for a, b in zip(results[base], rows))
        cont = sum(r["continued"] for r in rows)
        drafted = sum(r["drafted"] for r in rows)
        accepted = sum(r["accepted"] for r in rows)
        print(f"{name}: {differ} of {len(rows)} answers differ from {base}; {cont} calls "
              f"continued a session; {accepted} of {drafted} draft tokens accepted")  # fmt: skip
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
