"""Several `agspec serve` configurations (and `llama-server` types) side by side on the
same recorded calls, every call sent to each server in turn (rotating who goes first), so
a slow spell of the host falls on all of them alike.

Configurations are separated by `:`; `llama-server=TYPE` is llama.cpp's server with that
`--spec-type` (none: plain). Reports decode-only and end-to-end completion tokens/s,
drafted / accepted tokens, verification steps, the live cost profile's probes, and how
many answers equal the first configuration's.

    python benchmarks/ab_serve.py --calls 16 -- : --fixed-cost-profile : llama-server=ngram-mod
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_peers import LlamaServer, load_calls  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=16, help="first N calls of --role")
    ap.add_argument("--role", default="code", help="call role (all: every call)")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument(
        "configs",
        nargs=argparse.REMAINDER,
        help="after --: agspec serve arguments per configuration, ':' between",
    )
    args = ap.parse_args(argv)
    from agspec.models import resolve_model
    from agspec.serve.launch import ServerProcess

    rest = [a for a in args.configs if a != "--"]
    configs: list[list[str]] = [[]]
    for a in rest:
        if a == ":":
            configs.append([])
        else:
            configs[-1].append(a)
    calls = [c for c in load_calls(None) if args.role == "all" or c[0] == args.role]
    calls = calls[: args.calls]
    gguf = str(resolve_model(args.model))
    servers: list[tuple[str, Any, bool]] = []
    try:
        for cfg in configs:
            if cfg and cfg[0].startswith("llama-server="):
                import subprocess

                binary = subprocess.run(
                    ["bash", str(Path(__file__).resolve().parents[1] / "scripts"
                                 / "install_llama_server.sh"), sys.executable],
                    check=True, capture_output=True, text=True,
                ).stdout.strip().splitlines()[-1]  # fmt: skip
                st = cfg[0].split("=", 1)[1]
                srv = LlamaServer(binary, gguf, args.threads, 1, args.n_ctx, st).start()
                servers.append((f"llama-server --spec-type {st}", srv, True))
            else:
                srv = ServerProcess(
                    [
                        "--model",
                        args.model,
                        "--threads",
                        str(args.threads),
                        "--n-ctx",
                        str(args.n_ctx),
                        "--parallel",
                        "1",
                        *cfg,
                    ]
                )
                servers.append((" ".join(cfg) or "agspec serve (defaults)", srv.start(), False))
        totals = [[0.0] * 6 for _ in servers]
        texts: list[list[str]] = [[] for _ in servers]
        for i, (_, msgs) in enumerate(calls):
            order = list(range(len(servers)))
            order = order[i % len(order) :] + order[: i % len(order)]
            for s in order:
                name, srv, is_llama = servers[s]
                body = {"model": args.model, "messages": msgs,
                        "max_tokens": args.max_tokens, "temperature": 0}  # fmt: skip
                req = urllib.request.Request(
                    f"{srv.base_url}/chat/completions", data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                t0 = time.monotonic()
                with urllib.request.urlopen(req, timeout=900) as resp:
                    j = json.loads(resp.read())
                wall = time.monotonic() - t0
                n = j["usage"]["completion_tokens"]
                if is_llama:
                    t = j.get("timings") or {}
                    row = (n, t.get("predicted_ms", 0.0), wall, t.get("draft_n", 0),
                           t.get("draft_n_accepted", 0), 0)  # fmt: skip
                else:
                    a = j["agspec"]
                    row = (n, a["decode_ms"], wall, a["drafted_tokens"], a["accepted_tokens"],
                           a["steps"])  # fmt: skip
                totals[s] = [x + y for x, y in zip(totals[s], row)]
                texts[s].append(j["choices"][0]["message"]["content"])
            print(f"call {i + 1}/{len(calls)} done", file=sys.stderr, flush=True)
        probes = []
        for _, srv, is_llama in servers:
            cp = {} if is_llama else (srv.get_json("/health").get("cost_profile") or {})
            probes.append((cp.get("probes"), cp.get("probe_share")))
    finally:
        for _, srv, _ in servers:
            srv.stop()
    print(f"{len(calls)} {args.role} calls, {args.max_tokens} tokens, {args.threads} threads; "
          f"uptime {os.getloadavg()[0]:.2f}")  # fmt: skip
    for (name, _, _), t, tx, (pr, share) in zip(servers, totals, texts, probes):
        equal = sum(a == b for a, b in zip(tx, texts[0]))
        print(f"{name:44s} decode {t[0] / t[1] * 1000:6.2f} tok/s  end-to-end "
              f"{t[0] / t[2]:6.2f}  drafted {int(t[3])} accepted {int(t[4])} steps "
              f"{int(t[5])}  probes {pr} ({share})  equal to first {equal}/{len(tx)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
