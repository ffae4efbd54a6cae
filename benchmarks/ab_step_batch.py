"""`step_batch` of this tree against another tree's, in one process, round after round.

This host's speed swings by up to 2x within minutes, so two processes run a minute apart
compare windows, not code. Here both trees run in one process: the other tree's package
is copied to a temporary folder as `agspec_other` (its imports renamed), each tree builds
its own global corpus from the same documents, and the two replay the same B-slot
lockstep run (`bench_step_batch.Lockstep`) step by step in turns, in the order A B B A
A B ..., so that a slow spell of the host falls on both alike (garbage collection off
while timing). Prints µs per request-step of every round, each pair's ratio, and the
median ratio; exits non-zero when the two trees' runs commit a different number of
tokens per step (their drafts differ).

    python benchmarks/ab_step_batch.py --other ../wt/base --rounds 8
    python benchmarks/ab_step_batch.py --other ../wt/base --rounds 8 --trees   # token trees
    python benchmarks/ab_step_batch.py --other ../base --other-native --rounds 5 \
        --trees --tree-batch   # this tree's step_batch(trees=True) against per-call trees
    python benchmarks/ab_step_batch.py --other ../base --other-native --rounds 5 \
        --trees --tree-batch --other-tree-batch   # both trees' step_batch(trees=True)

--cost-model prices both with another profile (default the H200 roofline of a 32B model;
a measured CPU profile, where trees do not pay, shows what trees cost when none is drafted).

With --tree-batch this tree steps its trees in `step_batch(..., trees=True)` (every
accept, then every tree) and the other accept + propose_tree per request, so their
tokens per step may differ a little (printed, not checked).

By default the two trees share this tree's native module (Python changes only: the
script refuses a tree whose cpp/ differs). To compare native changes, build the other
tree's module with a nanobind domain of its own (nanobind registers each native type once
per domain and process) and pass --other-native:

    (cd ../base && .venv/bin/pip install --no-build-isolation \
        -C cmake.define.AGSPEC_NB_DOMAIN=ab -e .)
    python benchmarks/ab_step_batch.py --other ../base --other-native --rounds 8
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_step_batch as bsb
from devtraces import global_docs

import agspec
from agspec.tokenizers import get_tokenizer


def same_native_code(tree: Path) -> bool:
    """Whether the other checkout's native sources (cpp/) are this tree's."""
    here = Path(__file__).resolve().parents[1]
    names = {p.relative_to(here) for p in (here / "cpp").rglob("*") if p.is_file()}
    names |= {p.relative_to(tree) for p in (tree / "cpp").rglob("*") if p.is_file()}
    for name in names:
        a, b = here / name, tree / name
        if not (a.is_file() and b.is_file()) or a.read_bytes() != b.read_bytes():
            return False
    return True


def built_native(tree: Path) -> Path:
    """The other checkout's built `_native` (its venv's editable install, or in place)."""
    found = sorted(tree.glob(".venv/lib/python*/site-packages/agspec/_native*.so"))
    found += sorted((tree / "src" / "agspec").glob("_native*.so"))
    if not found:
        raise SystemExit(f"{tree}: no built _native module (.venv or src/agspec)")
    return found[0]


def import_other(tree: Path, into: Path, own_native: bool):
    """The other tree's package, imported as `agspec_other` from a renamed copy. Its
    native module is this tree's (the same cpp/ sources: Python changes only), or with
    `own_native` its own build, which must have been built with a nanobind domain of its
    own (nanobind registers each native type once per domain and process)."""
    src = tree / "src" / "agspec"
    if not (src / "__init__.py").is_file():
        raise SystemExit(f"{tree} is not an agspec checkout (no src/agspec/__init__.py)")
    if not own_native and not same_native_code(tree):
        raise SystemExit(
            f"{tree}: its native sources (cpp/) differ from this tree's. Build it with a "
            "nanobind domain of its own (in it: .venv/bin/pip install --no-build-isolation "
            "-C cmake.define.AGSPEC_NB_DOMAIN=ab -e .) and pass --other-native"
        )
    dst = into / "agspec_other"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    pattern = re.compile(r"\bagspec(?=[.\s])")
    for py in dst.rglob("*.py"):
        text = pattern.sub("agspec_other", py.read_text(encoding="utf-8"))
        if not own_native:
            text = text.replace("from agspec_other import _native", "from agspec import _native")
        py.write_text(text, encoding="utf-8")
    if own_native:
        so = built_native(tree)
        shutil.copy2(so, dst / so.name)
    if own_native:
        # Two builds in one nanobind domain abort the process at import: try it in a child.
        probe = subprocess.run(
            [sys.executable, "-c", "import agspec._native, agspec_other._native"],
            cwd=into,
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0:
            raise SystemExit(
                f"{tree}: its native module cannot be loaded beside this tree's (was it built "
                "with -C cmake.define.AGSPEC_NB_DOMAIN=ab?): "
                + (probe.stderr.strip().splitlines() or ["no message"])[-1]
            )
    sys.path.insert(0, str(into))
    return importlib.import_module("agspec_other")


def setup(pkg, variant: str, docs, cost_model: str, batch: int):
    """(a server factory, the package's drafter module) for one tree."""
    drafter = importlib.import_module(f"{pkg.__name__}.drafter")
    corpora = importlib.import_module(f"{pkg.__name__}.corpora")
    costmodel = importlib.import_module(f"{pkg.__name__}.policy.costmodel")
    tokenizers = importlib.import_module(f"{pkg.__name__}.tokenizers")
    g = corpora.GlobalCorpus.build(docs)
    cm = costmodel.get_cost_model(cost_model, context_tokens=16384)
    tok = tokenizers.get_tokenizer("qwen2.5")

    def server():
        return drafter.AgSpecServer(
            tokenizer=tok, global_corpus=g, config=drafter.VARIANTS[variant], cost_model=cm,
            batch_size=batch,
        )  # fmt: skip

    return server, drafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per tree")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--variant", default="agspec")
    ap.add_argument("--other-variant", help="the variant's name in the other tree")
    ap.add_argument(
        "--other-native",
        action="store_true",
        help="load the other tree's own native build (built with -C "
        "cmake.define.AGSPEC_NB_DOMAIN=ab) instead of sharing this tree's",
    )
    ap.add_argument("--source", default="swe-agent", choices=sorted(bsb.DIRS))
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--global-tokens", type=int, default=10_000_000)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument(
        "--cost-model",
        default="h200-qwen2.5-32b",
        help="the cost model both servers price drafts with (a measured CPU profile, such "
        "as epyc2t-llamacpp-qwen2.5-coder-0.5b-measured, prices trees out)",
    )
    ap.add_argument(
        "--trees",
        action="store_true",
        help="time accept + propose_tree per request (token trees) instead of step_batch",
    )
    ap.add_argument(
        "--tree-batch",
        action="store_true",
        help="with --trees: this tree steps its trees in step_batch(..., trees=True)",
    )
    ap.add_argument(
        "--other-tree-batch",
        action="store_true",
        help="with --tree-batch: the other tree too (the same drafts: tokens per step checked)",
    )
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.tree_batch and not args.trees:
        ap.error("--tree-batch needs --trees")
    if args.other_tree_batch and not args.tree_batch:
        ap.error("--other-tree-batch needs --tree-batch")
    # step_batch (chains), or accept + propose_tree per request (token trees).
    mode: bool | str = "trees" if args.trees else True
    modes = {
        "this": "tree-batch" if args.tree_batch else mode,
        "other": "tree-batch" if args.other_tree_batch else mode,
    }
    tok = get_tokenizer("qwen2.5")
    sessions, rest = bsb.load_sessions(args.source, tok, args.sessions)
    docs = global_docs(rest, tok, max_tokens=args.global_tokens)
    cost = args.cost_model
    with tempfile.TemporaryDirectory(prefix="agspec-ab-") as tmp:
        other = import_other(args.other.resolve(), Path(tmp), args.other_native)
        trees = {
            "this": setup(agspec, args.variant, docs, cost, args.batch_size),
            "other": setup(other, args.other_variant or args.variant, docs, cost, args.batch_size),
        }
        del docs
        print(
            f"B = {args.batch_size}, variant {args.variant}, {len(sessions)} sessions; "
            f"this: {Path(agspec.__file__).parents[2]}, other: {args.other}"
        )
        times: dict[str, list[float]] = {"this": [], "other": []}
        full: dict[str, list[float]] = {"this": [], "other": []}
        tokens: dict[str, float] = {}
        for r in range(args.rounds):
            # The two runs step by turns (this, other, other, this, ...): each pair of
            # rounds is timed microseconds apart, so a slow spell of the host falls on both.
            runs = {}
            for name, (make, drafter) in trees.items():
                bsb.drafter_mod = drafter
                runs[name] = (bsb.Lockstep(make(), sessions, args.batch_size, args.max_draft,
                                           modes[name]), drafter)  # fmt: skip
            ns = {"this": 0, "other": 0}
            full_ns = {"this": 0, "other": 0}
            steps = {"this": 0, "other": 0}
            full_steps = {"this": 0, "other": 0}
            gc.collect()
            gc.disable()
            k = 0
            live = ["this", "other"]
            while live:
                order = live if k % 2 == 0 else live[::-1]
                k += 1
                for name in order:
                    lock, drafter = runs[name]
                    bsb.drafter_mod = drafter
                    res = lock.step()
                    if res is None:
                        live.remove(name)
                        continue
                    t, requests, _ = res
                    ns[name] += t
                    steps[name] += requests
                    if requests == args.batch_size:
                        full_ns[name] += t
                        full_steps[name] += requests
            gc.enable()
            for name in trees:
                times[name].append(ns[name] / 1e3 / max(1, steps[name]))
                full[name].append(full_ns[name] / 1e3 / max(1, full_steps[name]))
                tps = runs[name][0].tokens / max(1, steps[name])
                if tokens.setdefault(name, tps) != tps:
                    raise SystemExit(f"{name}: tokens per step changed between rounds")
            print(
                f"round {r + 1:>2} {time.strftime('%H:%M:%S', time.gmtime())}  "
                f"this {times['this'][-1]:6.2f} (full {full['this'][-1]:6.2f})  "
                f"other {times['other'][-1]:6.2f} (full {full['other'][-1]:6.2f})  "
                f"ratio {times['this'][-1] / times['other'][-1]:.3f}",
                flush=True,
            )
        ratios = [a / b for a, b in zip(times["this"], times["other"])]
        print(
            f"median µs per request-step: this {statistics.median(times['this']):.2f}, "
            f"other {statistics.median(times['other']):.2f}; full batch: this "
            f"{statistics.median(full['this']):.2f}, other {statistics.median(full['other']):.2f}"
        )
        print(
            f"ratio this/other: median {statistics.median(ratios):.3f}, "
            f"range {min(ratios):.3f}-{max(ratios):.3f}"
        )
        print(f"tokens per step: this {tokens['this']:.6f}, other {tokens['other']:.6f}")
        if tokens["this"] != tokens["other"] and modes["this"] == modes["other"]:
            print("the two trees committed different tokens per step", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
