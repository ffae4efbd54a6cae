"""Drafting µs per output token, before and after a change, measured side by side.

Runs `agspec replay` (B = 1, no step files) on each trace file twice: once with an older
source tree (`--before-src`, e.g. `git archive <commit> src | tar -x -C /tmp/before` plus
the built native module copied into `src/agspec/`), run with this interpreter while
every installed `agspec` is hidden, and once with the installed tree. Sources alternate
which tree goes first, so load drift on a shared machine hits both alike. The load
average is recorded before and after every replay. Then one markdown table:
tokens/step and drafting µs per output token for every drafter and source: before as
the older tree measured it (wall clock, if it predates the CPU clock), after both in wall
clock and in the thread's CPU time (the lab's measure since issue 15), and of the latter
the setup part (`begin`, `end`, `open_artifact`, outside `propose`/`accept`).

    flock /tmp/agspec-bench.lock python benchmarks/drafting_cost.py \\
        --before-src /tmp/before/src --traces traces/chatdev.jsonl traces/swe-agent.jsonl \\
        --drafters pld-hf suffix-64 agspec-paper --after-only suffix-cache -o runs/drafting-cost
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Runs `agspec` from the tree given first, hiding editable installs of any other tree.
_RUN_TREE = r"""
import runpy, sys
tree = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuildRedirectingFinder" not in repr(f)]
sys.path.insert(0, tree)
sys.argv[0] = "agspec"
runpy.run_module("agspec", run_name="__main__", alter_sys=True)
"""


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def replay(tree: str | None, trace: str, drafters: list[str], out: Path, limit: int | None) -> dict:
    args = [trace, "--drafters", *drafters, "--batch-size", "1", "-o", str(out)]
    args += ["--cost-model", "h200-qwen2.5-32b", "--no-steps", "--no-plots", "--no-progress"]
    if limit is not None:
        args += ["--limit-sessions", str(limit)]
    if tree is None:
        cmd = [sys.executable, "-m", "agspec", "replay", *args]
    else:
        cmd = [sys.executable, "-c", _RUN_TREE, tree, "replay", *args]
    before = load_average()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    after = load_average()
    entries = json.loads((out / "summary.json").read_text())["entries"]
    return {"load": f"{before} -> {after}", "entries": entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", required=True, help="the older tree's src/ folder")
    ap.add_argument("--traces", nargs="+", required=True, help="AgSpec-format JSONL files")
    ap.add_argument("--drafters", nargs="+", required=True, help="run by both trees")
    ap.add_argument("--after-only", nargs="*", default=[], help="drafters only the new tree has")
    ap.add_argument("--limit-sessions", type=int, default=None)
    ap.add_argument("--limit-for", nargs="*", default=[], help="SOURCE=N overrides")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = {k: int(v) for k, v in (s.split("=", 1) for s in a.limit_for)}
    results: dict[str, dict[str, Any]] = {}
    for i, trace in enumerate(a.traces):
        name = Path(trace).stem
        limit = limits.get(name, a.limit_sessions)
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        results[name] = {}
        for which in order:
            tree = os.path.abspath(a.before_src) if which == "before" else None
            drafters = a.drafters if which == "before" else [*a.drafters, *a.after_only]
            results[name][which] = replay(tree, trace, drafters, out / f"{name}-{which}", limit)
            print(f"{name} {which}: load {results[name][which]['load']}", flush=True)
    (out / "drafting_cost.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| source | drafter | tok/step before | tok/step after | µs/tok before (wall) | "
        "µs/tok after (wall) | µs/tok after (CPU) | of which setup (CPU) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for source, runs in results.items():
        before = {e["drafter"]: e for e in runs["before"]["entries"]}
        for e in runs["after"]["entries"]:
            b = before.get(e["drafter"])
            nan = float("nan")
            cells = [
                source,
                e["drafter"],
                f"{b['tokens_per_step']:.3f}" if b else "-",
                f"{e['tokens_per_step']:.3f}",
                f"{b['draft_us_per_token']:.1f}" if b else "-",
                f"{e.get('draft_wall_us_per_token', nan):.1f}",
                f"{e['draft_us_per_token']:.1f}",
                f"{e.get('draft_setup_us_per_token', nan):.1f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    loads = [
        f"{source} {which}: {runs[which]['load']}"
        for source, runs in results.items()
        for which in ("before", "after")
    ]
    return (
        "\n".join(lines)
        + "\n\nload average (1/5/15 min), start -> end of each replay: "
        + ("; ".join(loads))
    )


if __name__ == "__main__":
    raise SystemExit(main())
