"""Load time of a saved index, and the share of it that is the structural check.

Loads the file three times and after each load runs `TokenIndex.verify()` alone (the
checks `load` makes after the checksum), then reads the file plainly for scale. Without
an existing file it builds one from the traces as `bench_token_index.py` does (the first
N tokens of the shuffled index pool, one document per trace file) and keeps it.

Example (the figures in docs/index.md, "Performance"):

    python benchmarks/bench_index_load.py --tokens 10000000 --file /tmp/10m.agidx
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_token_index as bench  # noqa: E402

from agspec.index.token_index import TokenIndex  # noqa: E402


def build(path: Path, num_tokens: int, traces: Path) -> None:
    streams = bench.load_streams(traces)
    _, _, pool = bench.split_streams(streams, 100_000, 0)
    docs, _ = bench.take_tokens(pool, num_tokens)
    idx = TokenIndex()
    for doc_id, doc in enumerate(docs):
        idx.extend(doc_id, doc)
    idx.save(path)
    idx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, required=True, help="index file (built if absent)")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="tokens when building")
    parser.add_argument("--traces", type=Path, default=bench.DEFAULT_TRACES)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.file.exists():
        build(args.file, args.tokens, args.traces)
    print(f"# {args.file}: {args.file.stat().st_size / 1e6:.0f} MB, load average at start "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        idx = TokenIndex.load(args.file)
        t1 = time.perf_counter()
        verify_s = float("nan")
        if hasattr(idx, "verify"):  # absent before the structural checks existed
            idx.verify()
            verify_s = time.perf_counter() - t1
        idx.close()
        t2 = time.perf_counter()
        args.file.read_bytes()
        t3 = time.perf_counter()
        print(
            f"load {t1 - t0:.3f} s, structural check {verify_s:.3f} s, plain read {t3 - t2:.3f} s"
        )
    print(f"# load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
