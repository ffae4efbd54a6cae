#!/bin/bash
# Issue 11's timing, side by side on a quiet machine: the drafter per output token before
# the redesign (OLD: a checkout of d9e46c3) and now, and step_batch at the start of
# session 11 (S10: a checkout of 5a0b4a5) and now (with its batch helper threads, and
# on one thread), alternating, two rounds each.
#   OLD=/path/d9e46c3 S10=/path/5a0b4a5 bash benchmarks/redesign_ab.sh > ab.log
# Each older checkout needs its own .venv: python3 -m venv --system-site-packages .venv &&
# .venv/bin/pip install --no-build-isolation -e .   (PY: this tree's python, default python3)
set -u
OLD=${OLD:?a checkout of d9e46c3 with .venv}; S10=${S10:?a checkout of 5a0b4a5 with .venv}; NEW=${NEW:-$(cd "$(dirname "$0")/.." && pwd)}
BD="benchmarks/bench_drafter.py --source swe-agent --sessions 20 --global-tokens 10000000"
BS="benchmarks/bench_step_batch.py --global-tokens 10000000 --batch-sizes 1 8 64"
for r in 1 2; do
  echo "== round $r $(date -u +%T) $(uptime)"
  (cd $OLD && echo "-- old d9e46c3 bench_drafter agspec(paper)" && .venv/bin/python $BD --variant agspec 2>&1 | tail -8)
  (cd $NEW && echo "-- new $(git rev-parse --short HEAD) bench_drafter agspec-paper" && ${PY:-python3} $BD --variant agspec-paper 2>&1 | tail -8)
done
(cd $NEW && echo "-- new bench_drafter agspec (default)" && ${PY:-python3} $BD --variant agspec 2>&1 | tail -8)
for r in 1 2; do
  echo "== step_batch round $r $(date -u +%T) $(uptime)"
  (cd $S10 && echo "-- s10 5a0b4a5 step_batch agspec-cost-plus (= new agspec)" && .venv/bin/python $BS --variant agspec-cost-plus 2>&1 | tail -12)
  (cd $NEW && echo "-- new step_batch agspec" && ${PY:-python3} $BS --variant agspec 2>&1 | tail -12)
  (cd $NEW && echo "-- new step_batch agspec, one thread (AGSPEC_BATCH_THREADS=1)" && AGSPEC_BATCH_THREADS=1 ${PY:-python3} $BS --variant agspec 2>&1 | tail -12)
  (cd $S10 && echo "-- s10 5a0b4a5 step_batch agspec (= new agspec-paper)" && .venv/bin/python $BS --variant agspec 2>&1 | tail -12)
  (cd $NEW && echo "-- new step_batch agspec-paper" && ${PY:-python3} $BS --variant agspec-paper 2>&1 | tail -12)
done
echo "== done $(date -u +%T) $(uptime)"
