#!/usr/bin/env bash
# Regenerate the default traces shipped in src/agspec/data/traces/ (docs/pipeline.md):
# every bundled task, Qwen2.5-Coder-0.5B-Instruct greedy on llama.cpp with AgSpec drafting
# (lossless, so the outputs are the model's greedy outputs), then gzip.
# Resumable: rerun after an interruption and finished sessions are kept.
# Needs: llama-cpp-python (scripts/install_llama_cpp.sh) and
#        `agspec models fetch qwen2.5-coder-0.5b-instruct`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-build/default-traces}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-384}
MAX_TURNS=${MAX_TURNS:-3}
mkdir -p "$OUT_DIR"
start=$(date +%s)
PYTHONPATH=src python -m agspec record all -o "$OUT_DIR/default.jsonl" \
  --model qwen2.5-coder-0.5b --drafter agspec-paper --max-turns "$MAX_TURNS" \
  --max-new-tokens "$MAX_NEW_TOKENS" --localizer-max-new-tokens 64 \
  --num-draft-tokens 16 --threads 1 "$@"
echo "recording wall time: $(( $(date +%s) - start )) s" >&2
PYTHONPATH=src python -m agspec traces check "$OUT_DIR/default.jsonl"
gzip -9 -n -c "$OUT_DIR/default.jsonl" > src/agspec/data/traces/default.jsonl.gz
gzip -9 -n -c "$OUT_DIR/default.live.jsonl" > src/agspec/data/traces/default.live.jsonl.gz
ls -l src/agspec/data/traces/
