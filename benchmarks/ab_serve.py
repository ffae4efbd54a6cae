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
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_peers import LlamaServer, chat_call, llama_server_binary, load_calls  # noqa: E402


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
                st = cfg[0].split("=", 1)[1]
                srv = LlamaServer(llama_server_binary(), gguf, args.threads, 1, args.n_ctx, st)
                servers.append((f"llama-server --spec-type {st}", srv.start(), True))
            else:
                base = ["--model", args.model, "--threads", str(args.threads),
                        "--n-ctx", str(args.n_ctx), "--parallel", "1"]  # fmt: skip
                srv = ServerProcess([*base, *cfg]).start()
                servers.append((" ".join(cfg) or "agspec serve (defaults)", srv, False))
        totals = [[0.0] * 6 for _ in servers]
        texts: list[list[str]] = [[] for _ in servers]
        for i, (_, msgs) in enumerate(calls):
            order = list(range(len(servers)))
            order = order[i % len(order) :] + order[: i % len(order)]
            for s in order:
                srv = servers[s][1]
                c = chat_call(srv.base_url, args.model, msgs, args.max_tokens)
                row = (c["tokens"], c["decode_ms"], c["wall_s"], c["drafted"], c["accepted"],
                       c["steps"])  # fmt: skip
                totals[s] = [x + y for x, y in zip(totals[s], row)]
                texts[s].append(c["text"])
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
