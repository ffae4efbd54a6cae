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
import sys
from pathlib import Path

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


def _measure(args: argparse.Namespace) -> int:
    if args.backend == "llama.cpp":
        from agspec.adapters.llama_cpp import measure_cost_profile as measure
    else:
        from agspec.adapters.transformers import measure_model_cost_profile as measure
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
