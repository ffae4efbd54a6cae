"""`agspec costmodel measure --model NAME -o profile.json`: time verification on llama.cpp
(default) or, with `--backend transformers`, on a transformers model (a model folder, or a
GGUF file that transformers dequantizes).

For n = 1 … `--max-tokens` it times one forward pass that evaluates n tokens after a
`--context-tokens` context (median of `--repeats`, KV cache rolled back after each pass)
and writes an `agspec-cost-profile` (see `agspec.policy.costmodel.ProfileCostModel`):

    {"format": "agspec-cost-profile", "version": 1, "backend": "llama.cpp",
     "model": "qwen2.5-coder-0.5b-instruct", "device": "cpu (2 threads)",
     "context_tokens": 512,
     "batch_sizes": {"1": {"n_tokens": [1, 2, ...], "step_ms": [21.0, 27.5, ...]}}}

`step_ms[i]` is the wall time of one forward pass verifying `n_tokens[i]` tokens (batch 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from agspec._files import atomic_write_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("costmodel", help="measure verification cost profiles")
    sub = parser.add_subparsers(dest="costmodel_command", metavar="ACTION", required=True)
    measure = sub.add_parser(
        "measure", help="time one verification step for n = 1..N tokens on a local backend"
    )
    measure.add_argument(
        "--model",
        required=True,
        help="pinned model name or a .gguf path (transformers: also a model folder)",
    )
    measure.add_argument(
        "--backend",
        choices=("llama.cpp", "transformers"),
        default="llama.cpp",
        help="the engine to time (default llama.cpp)",
    )
    measure.add_argument("-o", "--output", required=True, help="profile JSON to write")
    measure.add_argument("--max-tokens", type=int, default=32, help="largest n (default 32)")
    measure.add_argument(
        "--context-tokens",
        type=int,
        default=512,
        help="tokens already in the KV cache (default 512)",
    )
    measure.add_argument("--repeats", type=int, default=5, help="passes per n (median)")
    measure.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2))
    measure.add_argument("--cache-dir", default=None, help="model cache folder")
    measure.set_defaults(func=_measure)


def measure_profile(
    model: str,
    *,
    max_tokens: int = 32,
    context_tokens: int = 512,
    repeats: int = 5,
    threads: int = 2,
    cache_dir: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Measure and return the profile dict (see the module docstring)."""
    from agspec.adapters.llama_cpp import import_llama_cpp, time_verification_step
    from agspec.models import resolve_model

    if max_tokens < 1 or repeats < 1 or threads < 1:
        raise ValueError("--max-tokens, --repeats and --threads must be >= 1")
    if context_tokens < 1:
        raise ValueError(f"--context-tokens must be >= 1, got {context_tokens}")
    llama_cpp = import_llama_cpp()
    path = resolve_model(model, cache_dir)
    n_ctx = context_tokens + max_tokens + 8
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=max(512, max_tokens), n_threads=threads,
        n_threads_batch=threads,  # the default (all cores) spin-waits badly on a busy machine
        seed=0, verbose=False,
    )  # fmt: skip
    # A real-looking context: code tokenized by the model itself, repeated to length.
    seed_ids = llm.tokenize(b"def step(state, action):\n    return state + action  # noqa\n")
    context = (seed_ids * (context_tokens // len(seed_ids) + 1))[:context_tokens]
    time_verification_step(llm, context, 1, repeats=1)  # warm-up: prefill + first pass
    n_tokens = list(range(1, max_tokens + 1))
    # Rounds over every n, not n after n: a slow spell on a shared machine then spreads
    # over all n (the median drops it) instead of bending one stretch of the curve.
    samples: dict[int, list[float]] = {n: [] for n in n_tokens}
    for r in range(repeats):
        for n in n_tokens:
            samples[n].append(time_verification_step(llm, context, n, repeats=1))
        if progress is not None:
            progress(f"round {r + 1}/{repeats}: n=1 {samples[1][-1]:.2f} ms, "
                     f"n={max_tokens} {samples[max_tokens][-1]:.2f} ms")  # fmt: skip
    step_ms = [round(statistics.median(samples[n]), 4) for n in n_tokens]
    name = model if not str(model).endswith(".gguf") else Path(model).name
    return {
        "format": "agspec-cost-profile",
        "version": 1,
        "backend": "llama.cpp",
        "model": name,
        "device": f"cpu {platform.machine()} ({threads} threads)",
        "build": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "context_tokens": context_tokens,
        "batch_sizes": {"1": {"n_tokens": n_tokens, "step_ms": step_ms}},
    }


def measure_transformers_profile(
    model: str,
    *,
    max_tokens: int = 32,
    context_tokens: int = 512,
    repeats: int = 5,
    threads: int = 2,
    cache_dir: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The profile of a transformers model: a model folder, or a GGUF (pinned name or
    path) that transformers dequantizes to float32 (needs `gguf` and `accelerate`)."""
    from agspec.adapters.transformers import _import_torch_transformers, measure_cost_profile
    from agspec.models import resolve_model

    torch, _ = _import_torch_transformers()  # a clear ImportError when absent
    import transformers

    if max_tokens < 1 or repeats < 1 or threads < 1 or context_tokens < 1:
        raise ValueError("--max-tokens, --repeats, --threads, --context-tokens must be >= 1")
    torch.set_num_threads(threads)
    auto = transformers.AutoModelForCausalLM
    if Path(model).is_dir():
        loaded = auto.from_pretrained(model, dtype=torch.float32)
        name = Path(model).name
    else:
        gguf = resolve_model(model, cache_dir)
        loaded = auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        name = gguf.name
    loaded.eval()
    return measure_cost_profile(
        loaded,
        max_tokens=max_tokens,
        context_tokens=context_tokens,
        repeats=repeats,
        model_name=name,
        progress=progress,
    )


def _measure(args: argparse.Namespace) -> int:
    measure = measure_profile if args.backend == "llama.cpp" else measure_transformers_profile
    profile = measure(
        args.model,
        max_tokens=args.max_tokens,
        context_tokens=args.context_tokens,
        repeats=args.repeats,
        threads=args.threads,
        cache_dir=args.cache_dir,
        progress=lambda msg: print(msg, file=sys.stderr),
    )
    out = Path(args.output)
    atomic_write_text(out, json.dumps(profile, indent=1) + "\n")
    step = profile["batch_sizes"]["1"]["step_ms"]
    print(
        f"wrote {out}: n=1 {step[0]:.2f} ms, n={len(step)} {step[-1]:.2f} ms "
        f"({step[-1] / step[0]:.1f}x)"
    )
    return 0
