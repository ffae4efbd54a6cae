"""Does `memory_budget_bytes` (`agspec serve --memory-budget`) hold the process's memory?

Replays the dev traces' calls (every source, the default `agspec` drafter, history on)
through one `AgSpecServer`, pass after pass under fresh session ids, committing each
call's recorded output greedily as an engine would; after every call it samples the
process RSS and the corpora's measured bytes (`AgSpecServer.memory_bytes`). Each budget
runs in a child process of its own, so one run's freed memory cannot hide another's.

    python benchmarks/bench_memory_budget.py --budgets 0 256M 512M --passes 3

Prints, per budget: the peak of the measured corpora bytes and of the RSS growth over
the process's size before the first call (tokenized traces and the empty server
in the baseline, after `malloc_trim`), each as a share of the budget.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from devtraces import DIRS, begin_call, dev_sessions

from agspec._memory import release_free_memory
from agspec.cli.serve_cmd import parse_size
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.lab.greedy import greedy_replay
from agspec.policy.costmodel import ProfileCostModel, break_even_accept_prob
from agspec.tokenizers import get_tokenizer
from agspec.traces import render_call

PROFILE = (
    Path(__file__).resolve().parents[1]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def child(budget: int, passes: int, max_calls: int) -> dict[str, float]:
    tok = get_tokenizer("qwen2.5")
    calls = []
    for source in DIRS:
        for s in dev_sessions(source):
            for c in s.calls:
                prompt, out = render_call(c, tok)
                calls.append((s.session_id, c, prompt, out))
    calls = calls[:max_calls]
    # As `agspec serve` builds it: the shipped CPU profile prices the drafts.
    cost_model = ProfileCostModel.load(PROFILE)
    cfg = replace(
        VARIANTS["agspec"],
        memory_budget_bytes=budget,
        break_even_prob=float(break_even_accept_prob(cost_model, 1)),
    )
    server = AgSpecServer(tokenizer=tok, config=cfg, cost_model=cost_model)
    # Give back the tokenizer's freed scratch memory first, or the corpora would grow
    # into it unseen and the baseline would hide them.
    release_free_memory()
    base = _rss_bytes()
    peak_rss = peak_bytes = fed = 0
    t0 = time.perf_counter()
    for p in range(passes):
        for sid, c, prompt, out in calls:
            d = begin_call(server, f"{sid}#{p}", c, prompt)
            greedy_replay(d, out, 16)
            d.end()
            fed += len(prompt) + len(out)
            peak_rss = max(peak_rss, _rss_bytes() - base)
            peak_bytes = max(peak_bytes, server.memory_bytes())
    return {
        "budget_bytes": budget,
        "tokens_fed": fed,
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_corpus_bytes": peak_bytes,
        "peak_rss_growth_bytes": peak_rss,
        "live_token_budget": server.live_token_budget,
        "history_budget_tokens": server.history_budget_tokens,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", nargs="+", type=parse_size, default=[0, 256 << 20])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-calls", type=int, default=1_000_000)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.passes, args.max_calls)))
        return 0
    mib = 1 << 20
    print(f"{'budget':>10} {'tokens fed':>11} {'corpora peak':>13} {'RSS growth peak':>16} "
          f"{'RSS/budget':>10}  seconds")  # fmt: skip
    for budget in args.budgets:
        cmd = [sys.executable, __file__, "--child", str(budget), "--passes", str(args.passes),
               "--max-calls", str(args.max_calls)]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.stderr.write(run.stderr)
            return run.returncode
        row = json.loads(run.stdout)
        ratio = f"{row['peak_rss_growth_bytes'] / budget:.2f}" if budget else "-"
        name = f"{budget // mib} MiB" if budget else "none"
        corpora, rss = row["peak_corpus_bytes"] / mib, row["peak_rss_growth_bytes"] / mib
        print(f"{name:>10} {row['tokens_fed']:>11,} {corpora:>10.0f} MiB {rss:>12.0f} MiB "
              f"{ratio:>10}  {row['seconds']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
