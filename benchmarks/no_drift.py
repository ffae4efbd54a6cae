"""The no-drift check of a redesign: tokens/step of the same replays by two source trees.

Drives one tree's CLI (`PYTHON -m agspec`, a subprocess, so it works whatever that tree's
module layout) over the bundled default traces (`agspec/data/traces/default.jsonl.gz` of
that tree, as `scripts/run_default.sh` finds them) and the three dev sources of
`../shared/data/traces` (imported with that tree's `agspec traces import`, or read from
`--traces-from`), for the paper's method and every baseline, at each batch size and global
split, and writes every tokens/step as JSON and a markdown table. With `--compare` it
puts an earlier JSON beside it: before / after / difference, and flags every line that
moves by more than `--tolerance` (0.01 tokens/step).

Drafters are named canonically (`agspec-paper` is the paper's exact method); a tree that
calls one differently gets `--drafter-alias CANONICAL=NAME` (the tree before the rename:
`--drafter-alias agspec-paper=agspec`). Tokens/step is deterministic (a greedy replay of
recorded outputs), so it does not depend on load; the load average is recorded anyway.

    python benchmarks/no_drift.py --python ../old/.venv/bin/python \\
        --drafter-alias agspec-paper=agspec --work /tmp/drift/old \\
        --json /work/notes/drift-before.json --markdown /work/notes/drift-before.md
    python benchmarks/no_drift.py --python .venv/bin/python --work /tmp/drift/new \\
        --compare /work/notes/drift-before.json \\
        --json /tmp/drift-after.json --markdown /work/notes/drift-after.md

To tell a change of the importers (for instance issue 15's `source/model/task` session
ids, which move sessions between the two global-corpus folds) from drift in the replay
itself, replay one tree's imported traces with the other: `--traces-from /tmp/drift/new/traces`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The paper's method and every baseline of the tree before the redesign (its
# `agspec.replay.registry.drafter_names()` less the AgSpec ablations), canonical names.
DEFAULT_DRAFTERS = (
    "ar",
    "pld-hf",
    "pld-vllm",
    "rest",
    "sam-fixed",
    "sam-scaled",
    "suffix-64",
    "suffix-24",
    "suffix-64-local",
    "fastcoder",
    "oracle",
    "agspec-paper",
)
# label -> (importer format, folder under --shared); "default" is the bundled file.
DEV_SOURCES = {
    "swe-agent": ("swe-agent", "swe-agent-java"),
    "mini-swe-agent": ("mini-swe-agent", "mini-swe-agent"),
    "chatdev": ("chatdev", "chatdev"),
}
TRACE_SETS = ("default", *DEV_SOURCES)
_FIND_DEFAULT = (
    "from importlib.resources import files; print(files('agspec') / 'data/traces/default.jsonl.gz')"
)
_PACKAGE_DIR = "import agspec, os; print(os.path.dirname(agspec.__file__))"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _run(cmd: list[str], *, log: Path) -> str:
    """Run `cmd`; its stdout is returned, both streams go to `log`; failure says where."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        f"$ {' '.join(cmd)}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}",
        encoding="utf-8",
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}\n(log: {log})")
    return proc.stdout


def tree_info(python: str, work: Path) -> dict[str, Any]:
    """Where the interpreter's `agspec` lives and that tree's git commit."""
    package = _run([python, "-c", _PACKAGE_DIR], log=work / "logs" / "tree.log").strip()
    info: dict[str, Any] = {"python": python, "package": package}
    root = Path(package)
    while root != root.parent and not (root / ".git").exists():
        root = root.parent
    if (root / ".git").exists():
        git = ["git", "-C", str(root)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
        info.update(tree=str(root), commit=head.stdout.strip(), dirty=bool(dirty.stdout.strip()))
    return info


def trace_files(a: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Each trace set's AgSpec JSONL file: bundled, imported now, or from --traces-from."""
    out: dict[str, Path] = {}
    for label in a.traces:
        if a.traces_from is not None:
            path = Path(a.traces_from) / f"{label}.jsonl"
            if label == "default" and not path.exists():
                path = Path(a.traces_from) / "default.jsonl.gz"
            if not path.is_file():
                raise SystemExit(f"--traces-from: no {path}")
        elif label == "default":
            found = _run([a.python, "-c", _FIND_DEFAULT], log=work / "logs" / "find.log")
            path = Path(found.strip())
            if not path.is_file():
                raise SystemExit(f"this tree ships no bundled default traces ({path})")
        else:
            fmt, folder = DEV_SOURCES[label]
            src = Path(a.shared) / folder
            if not src.is_dir():
                raise SystemExit(f"no dev traces at {src} (see ../shared/data/README.md)")
            path = work / "traces" / f"{label}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            cmd = [a.python, "-m", "agspec", "traces", "import", fmt, str(src), "-o", str(path)]
            _run([*cmd, "--no-progress"], log=work / "logs" / f"import-{label}.log")
        out[label] = path
    return out


def replay(
    a: argparse.Namespace,
    label: str,
    path: Path,
    split: str,
    aliases: dict[str, str],
    work: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One `agspec replay` of one trace file and split: its rows and how it ran."""
    names = [aliases.get(d, d) for d in a.drafters]
    back = {aliases.get(d, d): d for d in a.drafters}
    run_dir = work / "runs" / f"{label}-{split}"
    cmd = [a.python, "-m", "agspec", "replay", str(path), "--drafters", *names]
    cmd += ["--batch-size", *map(str, a.batch_size), "--cost-model", a.cost_model]
    cmd += ["--global-split", split, "-o", str(run_dir), "--jobs", str(a.jobs)]
    cmd += ["--no-steps", "--no-plots", "--no-progress"]
    if a.limit_sessions is not None:
        cmd += ["--limit-sessions", str(a.limit_sessions)]
    load0, t0 = load_average(), time.perf_counter()
    _run(cmd, log=work / "logs" / f"replay-{label}-{split}.log")
    wall_s = time.perf_counter() - t0
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    rows = []
    for e in summary["entries"]:
        rows.append(
            {
                "traces": label,
                "source": e["source"],
                "split": split,
                "drafter": back.get(e["drafter"], e["drafter"]),
                "tree_name": e["drafter"],
                "batch_size": e["batch_size"],
                "tokens_per_step": e["tokens_per_step"],
                "mean_accept_length": e["mean_accept_length"],
                "num_sessions": e["num_sessions"],
                "num_output_tokens": e["num_output_tokens"],
                "num_steps": e["num_steps"],
            }
        )
    run = {
        "traces": label,
        "split": split,
        "command": " ".join(cmd),
        "wall_s": round(wall_s, 1),
        "load_before": load0,
        "load_after": load_average(),
    }
    return rows, run


def _key(row: dict[str, Any]) -> tuple[str, str, str, str, int]:
    return (row["traces"], row["source"], row["split"], row["drafter"], row["batch_size"])


def markdown(result: dict[str, Any], before: dict[str, Any] | None, tolerance: float) -> str:
    tree = result["tree"]
    lines = [
        f"# Tokens/step by `agspec replay`: {tree.get('tree', tree['package'])} "
        f"at {tree.get('commit', '?')[:10]}{' (dirty)' if tree.get('dirty') else ''}",
        "",
        f"Command: `{result['command']}`",
        f"Started {result['started']}, {result['wall_s']:.0f} s, load average "
        f"{result['load_before']} -> {result['load_after']}.",
        "",
    ]
    old: dict[tuple[str, str, str, str, int], dict[str, Any]] = {}
    if before is not None:
        old = {_key(r): r for r in before["rows"]}
        bt = before["tree"]
        lines += [
            f"Before: {bt.get('tree', bt['package'])} at {bt.get('commit', '?')[:10]} "
            f"(`{before['command']}`).",
            "",
        ]
    rows = sorted(result["rows"], key=_key)
    if before is None:
        lines += [
            "| traces | source | split | drafter | B | tokens/step | accept | sessions | "
            "output tokens |",
            "|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['traces']} | {r['source']} | {r['split']} | {r['drafter']} | "
                f"{r['batch_size']} | {r['tokens_per_step']:.4f} | "
                f"{r['mean_accept_length']:.4f} | {r['num_sessions']} | "
                f"{r['num_output_tokens']} |"
            )
        return "\n".join(lines) + "\n"
    lines += [
        "| traces | source | split | drafter | B | before | after | Δ | output tokens "
        "before / after | |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    moved = missing = 0
    seen = set()
    for r in rows:
        k = _key(r)
        seen.add(k)
        o = old.get(k)
        if o is None:
            missing += 1
            lines.append(
                f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | — | "
                f"{r['tokens_per_step']:.4f} | | — / {r['num_output_tokens']} | only after |"
            )
            continue
        delta = r["tokens_per_step"] - o["tokens_per_step"]
        flag = ""
        if abs(delta) > tolerance:
            moved += 1
            flag = "**moved**"
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {o['tokens_per_step']:.4f} | "
            f"{r['tokens_per_step']:.4f} | {delta:+.4f} | "
            f"{o['num_output_tokens']} / {r['num_output_tokens']} | {flag} |"
        )
    for k, o in sorted(old.items()):
        if k not in seen:
            missing += 1
            lines.append(
                f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | "
                f"{o['tokens_per_step']:.4f} | — | | {o['num_output_tokens']} / — | "
                "only before |"
            )
    lines += [
        "",
        f"{len(rows)} lines after, {len(old)} before: {moved} moved by more than "
        f"{tolerance} tokens/step, {missing} on one side only.",
    ]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary file beside it, renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="the tree's interpreter")
    ap.add_argument("--work", default=None, help="scratch folder: imported traces, run folders")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument(
        "--table-of",
        default=None,
        help="replay nothing: the table of this earlier --json (with --compare: both)",
    )
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--compare", default=None, help="an earlier --json: before / after table")
    ap.add_argument("--tolerance", type=float, default=0.01, help="tokens/step (default 0.01)")
    ap.add_argument("--drafters", nargs="+", default=list(DEFAULT_DRAFTERS))
    ap.add_argument(
        "--drafter-alias",
        action="append",
        default=[],
        metavar="CANONICAL=NAME",
        help="the tree's name of a drafter (repeatable), e.g. agspec-paper=agspec",
    )
    ap.add_argument("--traces", nargs="+", default=list(TRACE_SETS), choices=TRACE_SETS)
    ap.add_argument("--traces-from", default=None, help="folder of LABEL.jsonl: no import")
    ap.add_argument(
        "--shared",
        default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"),
        help="the dev traces (default ../shared/data/traces)",
    )
    ap.add_argument("--batch-size", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--global-split", nargs="+", default=["two-fold"], choices=["two-fold", "none"])
    ap.add_argument("--cost-model", default="h200-qwen2.5-32b")
    ap.add_argument("--limit-sessions", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="agspec replay --jobs")
    a = ap.parse_args(argv)
    aliases: dict[str, str] = {}
    for item in a.drafter_alias:
        canonical, sep, name = item.partition("=")
        if not sep or not canonical or not name:
            ap.error(f"--drafter-alias: expected CANONICAL=NAME, got {item!r}")
        aliases[canonical] = name
    before = None
    if a.compare is not None:
        before = json.loads(Path(a.compare).read_text(encoding="utf-8"))
    if a.table_of is not None:
        text = markdown(
            json.loads(Path(a.table_of).read_text(encoding="utf-8")), before, a.tolerance
        )
        if a.markdown is not None:
            _write(Path(a.markdown), text)
        print(text)
        return 0
    if a.work is None or a.json is None:
        ap.error("--work and --json are needed to replay (or --table-of to only print)")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load0, t0 = load_average(), time.perf_counter()
    info = tree_info(a.python, work)
    files = trace_files(a, work)
    rows: list[dict[str, Any]] = []
    runs = []
    for label, path in files.items():
        for split in a.global_split:
            r, run = replay(a, label, path, split, aliases, work)
            rows += r
            runs.append(run)
            print(f"{label} {split}: {len(r)} lines in {run['wall_s']} s", file=sys.stderr)
    result = {
        "tree": info,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": started,
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_before": load0,
        "load_after": load_average(),
        "aliases": aliases,
        "traces": {k: str(v) for k, v in files.items()},
        "runs": runs,
        "rows": rows,
    }
    _write(Path(a.json), json.dumps(result, indent=1) + "\n")
    text = markdown(result, before, a.tolerance)
    if a.markdown is not None:
        _write(Path(a.markdown), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
