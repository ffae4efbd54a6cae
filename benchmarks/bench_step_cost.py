"""What one verification step of n tokens costs on llama.cpp's CPU backend, measured two
ways on the same llama.cpp: the `llama_cpp` module (one `llama_decode` of n tokens after a
512-token context, every row's logits, the KV rolled back after each) and `llama-server`'s
own `timings.prompt_ms` for n new tokens after the same cached 512-token prefix. Rounds
over every n (a slow spell spreads over all n), medians, each relative to n = 1.

If the two curves agree, the shape of the cost profile (`agspec costmodel measure`) is
llama.cpp's, not our measurement's: on x86 its repacked Q4_K weights are multiplied four
rows at a time (a GEMM tile) and the remaining one to three rows one by one (GEMV), so
n = 5 costs a tile plus one more row. A third curve, the `llama_cpp` module with the last
row's logits only (what a prefill chunk asks for), tells what the output layer (the
vocabulary's logits) adds per verified row.

    python benchmarks/bench_step_cost.py --threads 2 --rounds 7
    python benchmarks/bench_step_cost.py --ns 1 2 4 8 16 17 32 33 48 64 65
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
CONTEXT = 512


def module_curve(
    gguf: str, threads: int, rounds: int, ns: tuple[int, ...], *, all_logits: bool = True
) -> dict[int, float]:
    """Median ms of one `llama_decode` of n tokens after the context, with every row's
    logits (a verification step) or, `all_logits=False`, the last row's only (prefill)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=CONTEXT + 2 * max(ns), n_batch=512,
                          n_threads=threads, n_threads_batch=threads, verbose=False)  # fmt: skip
    ctx, mem = llm._ctx.ctx, llama_cpp.llama_get_memory(llm._ctx.ctx)
    seed = llm.tokenize(b"def step(state, action):\n    return state + action  # noqa\n")
    context = (seed * (CONTEXT // len(seed) + 1))[:CONTEXT]
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(tokens: list[int], pos0: int, all_logits: bool) -> None:
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_logits or i == len(tokens) - 1 else 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    try:
        decode(context, 0, all_logits=False)
        samples: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(rounds):
            for n in ns:
                t = time.perf_counter()
                decode(context[:n], CONTEXT, all_logits=all_logits)
                samples[n].append((time.perf_counter() - t) * 1000.0)
                llama_cpp.llama_memory_seq_rm(mem, 0, CONTEXT, -1)
    finally:
        llama_cpp.llama_batch_free(batch)
    return {n: statistics.median(v) for n, v in samples.items()}


def server_curve(
    binary: str, gguf: str, threads: int, rounds: int, ns: tuple[int, ...]
) -> dict[int, float]:
    from agspec.serve.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "-m", gguf, "--port", str(port), "-t", str(threads), "-tb", str(threads),
         "-np", "1", "-c", "2048", "--no-webui", "--log-disable"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}")
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        text = "def step(state, action):\n    return state + action  # noqa\n"
        seed = post("/tokenize", {"content": text})["tokens"]
        context = (seed * (CONTEXT // len(seed) + 1))[:CONTEXT]
        samples: dict[int, list[float]] = {}
        k = 0
        for _ in range(rounds):
            for n in ns:
                k += 1
                # The cached prefix is the context (plus one token the server re-reads);
                # the n tokens after it are new, so prompt_n is n or n + 1 (whatever the
                # server reused), and each sample is filed under what it did evaluate.
                extra = [context[(k * 37 + i * 7) % CONTEXT] for i in range(n)]
                post("/completion", {"prompt": context + [context[k % CONTEXT]],
                                     "n_predict": 1, "cache_prompt": True})  # fmt: skip
                body = {"prompt": context + extra, "n_predict": 1, "cache_prompt": True}
                t = post("/completion", body)["timings"]
                samples.setdefault(int(t["prompt_n"]), []).append(float(t["prompt_ms"]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {n: statistics.median(v) for n, v in sorted(samples.items()) if len(v) >= 3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--llama-server", default=None, help="binary (default: build/cached)")
    ap.add_argument("--ns", type=int, nargs="+", default=list(NS), help="step sizes (tokens)")
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args(argv)
    ns = tuple(sorted({1, *args.ns}))
    if ns[0] < 1 or ns[-1] > 256:
        ap.error("--ns: sizes from 1 to 256 tokens")
    from agspec.models import resolve_model

    gguf = str(resolve_model(args.model))
    binary = args.llama_server or subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_llama_server.sh"), sys.executable],
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    mod = module_curve(gguf, args.threads, args.rounds, ns)
    last = module_curve(gguf, args.threads, args.rounds, ns, all_logits=False)
    srv = server_curve(binary, gguf, args.threads, args.rounds, ns)
    print(f"{'n':>3}  {'llama_cpp ms':>12} {'x n=1':>6}   {'last-row logits ms':>18}"
          f" {'x n=1':>6}   {'llama-server ms':>15} {'x n=1':>6}")  # fmt: skip
    for n in ns:
        s = (
            f"{srv[n]:15.2f} {srv[n] / srv[1]:6.2f}"
            if n in srv and 1 in srv
            else f"{'-':>15} {'-':>6}"
        )
        print(f"{n:3d}  {mod[n]:12.2f} {mod[n] / mod[1]:6.2f}   {last[n]:18.2f}"
              f" {last[n] / last[1]:6.2f}   {s}")  # fmt: skip
    if args.out:
        out = {"llama_cpp_ms": mod, "llama_cpp_last_logits_ms": last, "llama_server_ms": srv}
        Path(args.out).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
