"""`agspec serve` against llama.cpp's own `llama-server`, through the OpenAI API.

Replays the bundled sessions' calls (src/agspec/data/traces/default.jsonl.gz: the
messages as recorded, greedy, no session ids) against each server at each concurrency,
with the same GGUF and thread count:

- `agspec serve` (the default drafter) and `agspec serve --drafter none`, `--parallel` =
  the concurrency, and at a concurrency above 1 also the default with `--parallel 1` (the
  same clients on one slot: what batching itself gains);
- `llama-server -np <concurrency>` with `--spec-type` none, ngram-mod, ngram-map-k and
  ngram-cache (built by scripts/install_llama_server.sh).

Reports per server and concurrency: end-to-end completion tokens/s over the run (what
an agent waits for), the prompt tokens each server evaluated (the rest came from KV it
held), the time a call spends outside decoding (prefill, set-up, HTTP, waiting for a
slot), decode-only tokens/s by call role (agspec: `agspec.decode_ms`;
llama-server: its `timings.predicted_ms`), and how many answers equal plain decoding's
(`agspec serve --drafter none` at concurrency 1). One run by default; `--repeats N` runs
every server N times per concurrency in rotating order and reports each one's median run
with the spread (which calls overlap changes from run to run at concurrency > 1).

    python benchmarks/bench_serve_peers.py --quick          # <= 8 minutes on 2 cores
    python benchmarks/bench_serve_peers.py -o runs/peers.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "src" / "agspec" / "data" / "traces" / "default.jsonl.gz"
LLAMA_TYPES = ("none", "ngram-mod", "ngram-map-k", "ngram-cache")


def load_calls(limit: int | None) -> list[tuple[str, list[dict[str, str]]]]:
    from agspec.traces.io import read_sessions

    calls = []
    for session in read_sessions(TRACES):
        for call in session.calls:
            msgs = [{"role": m.role, "content": m.content} for m in call.messages]
            calls.append((call.role, msgs))
    return calls[:limit] if limit else calls


class LlamaServer:
    def __init__(self, binary: str, model: str, threads: int, parallel: int, n_ctx: int,
                 spec_type: str) -> None:  # fmt: skip
        from agspec.pipeline.agent_bench import llama_server_command
        from agspec.serve.launch import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = llama_server_command(binary, model, threads=threads, parallel=parallel,
                                   slot_ctx_tokens=n_ctx, spec_type=spec_type)  # fmt: skip
        cmd += ["--port", str(self.port), "--log-disable"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> LlamaServer:
        import urllib.request

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("llama-server did not start")

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def llama_server_binary() -> str:
    """llama-server's path, built from the vendored source and cached on first use."""
    from agspec.pipeline.agent_bench import llama_server_binary as binary

    return binary(sys.executable, ROOT)  # this checkout's script, however agspec is installed


def chat_call(base_url: str, model: str, msgs: list[dict[str, str]],
              max_tokens: int) -> dict[str, Any]:  # fmt: skip
    """One greedy chat call: the answer, its wall time and what the server says of it
    (agspec serve: its `agspec` object and vLLM's spec-decode metrics; llama-server: its
    `timings`), the same keys for both."""
    import urllib.request

    body = {"model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    t0 = time.monotonic()
    req = urllib.request.Request(
        f"{base_url}/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=900) as resp:
        j = json.loads(resp.read())
    wall = time.monotonic() - t0
    if "agspec" in j:
        a = j["agspec"]
        decode_ms, steps = a["decode_ms"], a["steps"]
        prefilled = j["usage"]["prompt_tokens"] - a["reused_prompt_tokens"]
        spec = (j.get("metrics") or {}).get("speculative_decoding") or {}
        drafted = spec.get("num_draft_tokens", 0)
        accepted = spec.get("num_accepted_draft_tokens", 0)
    else:
        timings = j.get("timings") or {}
        decode_ms, steps = timings.get("predicted_ms", 0.0), 0
        prefilled = timings.get("prompt_n", 0)
        drafted = timings.get("draft_n", 0)
        accepted = timings.get("draft_n_accepted", 0)
    return {"text": j["choices"][0]["message"]["content"],
            "tokens": j["usage"]["completion_tokens"], "wall_s": wall, "decode_ms": decode_ms,
            "prompt_tokens": j["usage"]["prompt_tokens"], "prefilled": prefilled,
            "drafted": drafted, "accepted": accepted, "steps": steps}  # fmt: skip


def replay(base_url: str, model: str, calls: list[tuple[str, list[dict[str, str]]]],
           concurrency: int, max_tokens: int) -> dict[str, Any]:  # fmt: skip

    out: list[dict[str, Any]] = [{} for _ in calls]
    lock = threading.Lock()

    def one(i: int) -> None:
        role, msgs = calls[i]
        row = chat_call(base_url, model, msgs, max_tokens)
        with lock:
            out[i] = {"role": role, **row}

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(calls))))
    elapsed = time.monotonic() - t0
    total = sum(o["tokens"] for o in out)
    by_role: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for o in out:
        by_role[o["role"]][0] += o["tokens"]
        by_role[o["role"]][1] += o["decode_ms"] / 1000.0
        by_role[o["role"]][2] += o["drafted"]
        by_role[o["role"]][3] += o["accepted"]
    return {
        "completion_tokens_per_s": total / elapsed,
        "elapsed_s": elapsed,
        # Prompt tokens the server evaluated (the rest came from KV it held).
        "prefilled_tokens": sum(o["prefilled"] for o in out),
        "prompt_tokens": sum(o["prompt_tokens"] for o in out),
        # What a call waits for besides decoding (prefill, drafter set-up, HTTP, queueing).
        "outside_decode_s_per_call": sum(o["wall_s"] - o["decode_ms"] / 1000.0 for o in out)
        / len(out),
        "decode_tokens_per_s_by_role": {
            k: (v[0] / v[1] if v[1] else None) for k, v in sorted(by_role.items())
        },
        # Draft tokens proposed and accepted (agspec: vLLM's per-request metrics;
        # llama-server: timings.draft_n / draft_n_accepted).
        "drafted_accepted_by_role": {k: [v[2], v[3]] for k, v in sorted(by_role.items())},
        "texts": [o["text"] for o in out],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--calls", type=int, default=0, help="first N calls only (0: all)")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--llama-server", default=None, help="binary (default: build/cached)")
    ap.add_argument(
        "--spec-types",
        nargs="*",
        default=list(LLAMA_TYPES),
        help="llama-server's --spec-type of each llama-server row (none: no rows)",
    )
    ap.add_argument(
        "--agspec-arg",
        action="append",
        default=[],
        help="one more `agspec serve` argument for its rows (repeatable)",
    )
    ap.add_argument("--drafters", nargs="+", default=["none", "agspec"],
                    help="the agspec serve rows' --drafter values")  # fmt: skip
    ap.add_argument(
        "--quick",
        action="store_true",
        help="12 calls, 96 tokens, concurrency 1, 4; llama-server none, ngram-mod",
    )
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every server per concurrency, the order rotated; each row "
                    "is its server's median run (the runs' figures are kept too)")  # fmt: skip
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.quick:
        args.calls, args.max_tokens, args.concurrency = 12, 96, [1, 4]
        args.spec_types = ["none", "ngram-mod"]
    from agspec.models import resolve_model
    from agspec.serve.launch import ServerProcess

    gguf = str(resolve_model(args.model))
    binary = args.llama_server or llama_server_binary()
    calls = load_calls(args.calls or None)
    print(f"{len(calls)} calls, {args.max_tokens} tokens, {args.threads} threads, "
          f"concurrency {args.concurrency}", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    reference: list[str] | None = None
    for conc in args.concurrency:
        servers: list[tuple[str, Any]] = []
        agspec_rows = [(d, conc) for d in args.drafters]
        if conc > 1 and "agspec" in args.drafters:  # the same clients on one slot
            agspec_rows.append(("agspec", 1))
        for drafter, par in agspec_rows:
            name = f"agspec serve --drafter {drafter}" + (" --parallel 1" if par != conc else "")
            servers.append((name, lambda d=drafter, p=par:
                            ServerProcess(["--model", args.model, "--threads", str(args.threads),
                                           "--n-ctx", str(args.n_ctx), "--parallel", str(p),
                                           "--drafter", d, *args.agspec_arg]).start()))  # fmt: skip
        for st in args.spec_types:
            servers.append(
                (
                    f"llama-server --spec-type {st}",
                    lambda st=st, c=conc: LlamaServer(
                        binary, gguf, args.threads, c, args.n_ctx, st
                    ).start(),
                )
            )
        # Each repeat runs every server once, the order rotated, so a slow spell of the
        # host falls on different servers; a row is the median run of its server.
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in servers}
        for rep in range(args.repeats):
            for name, make in servers[rep % len(servers) :] + servers[: rep % len(servers)]:
                srv = make()
                try:
                    res = replay(srv.base_url, args.model, calls, conc, args.max_tokens)
                finally:
                    srv.stop()
                if reference is None:  # agspec --drafter none at the first concurrency
                    reference = res["texts"]
                res["equal_to_plain"] = sum(a == b for a, b in zip(res.pop("texts"), reference))
                runs[name].append(res)
                if args.repeats > 1:
                    tps = res["completion_tokens_per_s"]
                    print(f"c={conc} {name:34s} run {rep + 1}/{args.repeats}: {tps:7.2f} "
                          "tok/s end-to-end", flush=True)  # fmt: skip
        for name, _ in servers:
            mine = sorted(runs[name], key=lambda r: r["completion_tokens_per_s"])
            res = dict(mine[(len(mine) - 1) // 2])
            equal = res.pop("equal_to_plain")
            row = {"server": name, "concurrency": conc, "equal_to_plain": equal,
                   "calls": len(calls), **res}  # fmt: skip
            if args.repeats > 1:
                row["runs_completion_tokens_per_s"] = [
                    r["completion_tokens_per_s"] for r in runs[name]
                ]
            rows.append(row)
            roles = " ".join(
                f"{k} {v:.1f} ({row['drafted_accepted_by_role'][k][1]}"
                f"/{row['drafted_accepted_by_role'][k][0]} accepted)"
                for k, v in row["decode_tokens_per_s_by_role"].items()
                if v
            )
            spread = ""
            if args.repeats > 1:
                got = row["runs_completion_tokens_per_s"]
                spread = f" (median of {len(got)}: {min(got):.2f}-{max(got):.2f})"
            print(f"c={conc} {name:34s} {row['completion_tokens_per_s']:7.2f} tok/s end-to-end"
                  f"{spread}"
                  f"  equal {equal}/{len(calls)}  prefilled {row['prefilled_tokens']}"
                  f"/{row['prompt_tokens']}  outside decode {row['outside_decode_s_per_call']:.2f}"
                  f" s/call  decode by role: {roles}", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
