"""Where a drafter's steps go, from a replay run folder's per-step records.

Every verification step is one of: no draft (plain decoding), a draft rejected at its
first token (one token, like plain decoding, but the verification was paid), a draft
accepted in part, a draft accepted in full. For each source and drafter this prints the
share of steps and of output tokens in each, which says what limits the drafter: no
match (no draft), the wrong continuation (rejected at the first token), or drafts too
short (full accepts that end early).

    agspec replay traces/chatdev.jsonl --drafters agspec oracle --batch-size 1 \
        --cost-model h200-qwen2.5-32b -o runs/why
    python benchmarks/step_breakdown.py runs/why
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

KINDS = ("no draft", "rejected at 1st", "partial", "full")


def breakdown(path: Path) -> tuple[Counter[str], Counter[str]]:
    import pyarrow.parquet as pq

    cols = pq.read_table(path, columns=["drafted", "accepted", "committed"]).to_pydict()
    steps: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for d, a, c in zip(cols["drafted"], cols["accepted"], cols["committed"]):
        kind = KINDS[0] if d == 0 else KINDS[1] if a == 0 else KINDS[3] if a == d else KINDS[2]
        steps[kind] += 1
        tokens[kind] += c
    return steps, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a replay run folder (agspec replay -o DIR)")
    ap.add_argument("--batch-size", type=int, default=1)
    args = ap.parse_args(argv)
    files = sorted((Path(args.run) / "steps").glob(f"*__b{args.batch_size}.parquet"))
    if not files:
        where = f"{args.run}/steps"
        print(f"no per-step records for B={args.batch_size} under {where}", file=sys.stderr)
        return 1
    head = " | ".join(f"{k}: steps / tokens" for k in KINDS)
    print(f"| source | drafter | tok/step | {head} |")
    print("|---|---|---|" + "---|" * len(KINDS))
    for f in files:
        source, drafter, _ = f.stem.split("__")
        steps, tokens = breakdown(f)
        n, t = sum(steps.values()), sum(tokens.values())
        cells = " | ".join(f"{steps[k] / n:.0%} / {tokens[k] / t:.0%}" for k in KINDS)
        print(f"| {source} | {drafter} | {t / n:.2f} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
