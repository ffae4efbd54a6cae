"""`agspec profile`: per-agent draft caps from recorded sessions (a caps file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="profile per-agent draft caps C_a from traces",
        description="Replay AgSpec-format traces, measure how far retrieved drafts match the "
        "recorded outputs per agent, and write the caps (last position whose acceptance "
        "probability beats the cost model's break-even p*) for each batch size.",
    )
    p.add_argument("traces", nargs="+", type=Path, help="AgSpec-format JSONL traces")
    p.add_argument("-o", "--out", type=Path, required=True, help="caps file to write (JSON)")
    p.add_argument(
        "--cost-model",
        default="h200-qwen2.5-32b",
        help="cost model preset or profile path (default h200-qwen2.5-32b)",
    )
    p.add_argument("--context-tokens", type=int, default=16384)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 16])
    p.add_argument("--model", default="", help="model name the caps are keyed by")
    p.add_argument("--max-tokens", type=int, default=64, help="longest position profiled")
    p.add_argument("--tokenizer", default="qwen2.5")
    p.set_defaults(func=_run)


def _load_cost_model(spec: str, context_tokens: int):  # noqa: ANN202
    from agspec.policy.costmodel import ProfileCostModel, get_cost_model

    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        return ProfileCostModel.load(path)
    return get_cost_model(spec, context_tokens=context_tokens)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agspec._files import check_not_input
    from agspec.lab.profile import profile_caps
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import read_sessions

    # Every argument is checked before the slow work (the tokenizer, the traces).
    for t in args.traces:
        if not t.is_file():
            raise FileNotFoundError(f"no trace file {t}")
    bad = [b for b in args.batch_size if b < 1]
    if bad or args.max_tokens < 1:
        raise ValueError(
            f"--batch-size must be ints >= 1 and --max-tokens an int >= 1, got "
            f"{args.batch_size} and {args.max_tokens}"
        )
    check_not_input(args.out, args.traces)
    cm = _load_cost_model(args.cost_model, args.context_tokens)
    tok = get_tokenizer(args.tokenizer)
    sessions = [s for t in args.traces for s in read_sessions(t)]
    with tqdm(total=len(sessions), unit="session", file=sys.stderr, desc="profile") as bar:
        caps = profile_caps(
            sessions,
            tok,
            cost_model=cm,
            batch_sizes=args.batch_size,
            model=args.model,
            max_tokens=args.max_tokens,
            progress=bar,
        )
    caps.save(args.out)
    rows = sorted(caps.caps.items())
    print(f"{'agent':<24}{'batch':>6}{'cap':>5}{'records':>9}{'p*':>7}")
    for (agent, _model, b), cap in rows:
        meta = caps.meta.get((agent, _model, b), {})
        print(
            f"{agent:<24}{b:>6}{cap:>5}{meta.get('num_records', 0):>9}"
            f"{meta.get('p_star', float('nan')):>7.3f}"
        )
    print(f"caps written to {args.out}")
    return 0
