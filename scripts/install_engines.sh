#!/usr/bin/env bash
# Optional engines the tests and benchmarks compare against: CPU torch, arctic-inference
# (SuffixDecoding, built from its sdist without a GPU), transformers, llama-cpp-python.
# Each step is skipped when already installed; AGSPEC_SKIP_LLAMA=1 skips llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pipq() { $PY -m pip install -q --disable-pip-version-check "$@"; }
has() { $PY -c "import $1" >/dev/null 2>&1; }

has torch || pipq torch==2.13.0
if ! has arctic_inference.suffix_decoding; then
    # Its sdist needs these in the build environment (and nanobind 2.9.2 at build time).
    pipq "nanobind==2.9.2" cmake ninja "protobuf==5.29.6" grpcio-tools setuptools wheel
    pipq --no-build-isolation arctic-inference==0.3.0
    pipq "nanobind==3.1.0"
fi
has transformers || pipq "transformers>=4.45,<6" "torch==2.13.0"
if [ "${AGSPEC_SKIP_LLAMA:-0}" != "1" ]; then
    bash scripts/install_llama_cpp.sh "$PY"   # checks the installed build itself
fi
