#!/bin/bash
# Issue 11's two targets in more rounds than redesign_ab.sh, alternating in one window:
#   B = 1: bench_b1_any_tree.py in the tree before the redesign (OLD: d9e46c3, where the
#          paper's method is "agspec") and in this tree ("agspec-paper"), R rounds;
#   B = 64: bench_step_batch.py --batch-sizes 64 in S10 (5a0b4a5, "agspec-cost-plus", the
#          same configuration as today's default) and here ("agspec", "agspec-paper"), 3 rounds.
#   OLD=/path/d9e46c3 S10=/path/5a0b4a5 bash benchmarks/redesign_rounds.sh > rounds.log
# Each older checkout needs its own .venv (see redesign_ab.sh); PY: this tree's python.
set -u
OLD=${OLD:?a checkout of d9e46c3 with .venv}; S10=${S10:?a checkout of 5a0b4a5 with .venv}
NEW=${NEW:-$(cd "$(dirname "$0")/.." && pwd)}; PY=${PY:-python3}; R=${R:-5}
B1="$NEW/benchmarks/bench_b1_any_tree.py"
BS="benchmarks/bench_step_batch.py --global-tokens 10000000 --batch-sizes 64"
for r in $(seq "$R"); do
  echo "== B=1 round $r $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd "$OLD" && echo "old $(.venv/bin/python "$B1" agspec 2>&1 | grep total)")
  (cd "$NEW" && echo "new $($PY "$B1" agspec-paper 2>&1 | grep total)")
done
for r in 1 2 3; do
  echo "== B=64 round $r $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd "$S10" && echo "s10 $(.venv/bin/python $BS --variant agspec-cost-plus 2>&1 | grep step_batch)")
  (cd "$NEW" && echo "new $($PY $BS --variant agspec 2>&1 | grep step_batch)")
  (cd "$NEW" && echo "new-paper $($PY $BS --variant agspec-paper 2>&1 | grep step_batch)")
done
echo "== done $(date -u +%T)"
