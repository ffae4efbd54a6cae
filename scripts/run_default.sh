#!/usr/bin/env bash
# The main job on the default that ships with the project: the replay lab on the bundled
# multi-agent traces (recorded by `agspec record` with Qwen2.5-Coder-0.5B; docs/pipeline.md),
# AR, the competing drafters and AgSpec, at batch 1 and 16, under the H200 roofline cost model
# of a 32B-class model. Writes runs/default/ (config.json, steps, summary.json, plots).
#   OUT=dir, DRAFTERS="...", BATCH="1 16", COST=... override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind==3.1.0" \
    cmake ninja
AGSPEC_SKIP_LLAMA=1 bash scripts/install_engines.sh  # CPU torch + arctic-inference (SuffixDecoding)
$PY -m pip install -q --disable-pip-version-check --no-build-isolation ".[plots]"

OUT=${OUT:-runs/default}
traces=$($PY -c "from importlib.resources import files; print(files('agspec') / 'data/traces/default.jsonl.gz')")
if [ ! -f "$traces" ]; then
    echo "no bundled default traces in this build: importing the dev traces from ../shared" >&2
    mkdir -p "$OUT/traces"
    agspec traces import chatdev ../shared/data/traces/chatdev -o "$OUT/traces/chatdev.jsonl"
    traces="$OUT/traces/chatdev.jsonl"
fi
DRAFTERS=${DRAFTERS:-ar pld-hf pld-vllm rest sam-fixed suffix-64 suffix-24 fastcoder agspec-paper agspec-paper+recent+history+cap32 agspec-paper+cost suffix-cache-tree agspec-chain agspec oracle-tree oracle}
agspec replay "$traces" --drafters $DRAFTERS --batch-size ${BATCH:-1 16} \
    --cost-model "${COST:-h200-qwen2.5-32b}" -o "$OUT"
