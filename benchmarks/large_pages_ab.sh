#!/bin/bash
# The index's large arrays on 2 MB pages (cpp/index/large_pages.h) against 4 KB pages
# (AGSPEC_LARGE_PAGES=0), alternating in one window, R rounds of:
#   B = 1: bench_b1_any_tree.py agspec-paper (µs per output token);
#   the global's continuations: bench_frozen_picks.py (µs per call, frozen and live);
#   B = 64: bench_step_batch.py --batch-sizes 64, the default (µs per request-step).
#   R=3 bash benchmarks/large_pages_ab.sh > large-pages.log
set -u
cd "$(dirname "$0")/.." && PY=${PY:-python3} && R=${R:-3}
for r in $(seq "$R"); do
  echo "== round $r $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  for lp in 0 1; do
    echo "large_pages=$lp b1 $(AGSPEC_LARGE_PAGES=$lp $PY benchmarks/bench_b1_any_tree.py agspec-paper 2>&1 | grep total)"
    echo "large_pages=$lp picks $(AGSPEC_LARGE_PAGES=$lp $PY benchmarks/bench_frozen_picks.py --positions 5000 2>&1 | grep 'per call')"
    echo "large_pages=$lp b64 $(AGSPEC_LARGE_PAGES=$lp $PY benchmarks/bench_step_batch.py --global-tokens 10000000 --batch-sizes 64 --variant agspec 2>&1 | grep step_batch)"
  done
done
echo "== done $(date -u +%T)"
