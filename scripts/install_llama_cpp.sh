#!/usr/bin/env bash
# Build and install llama-cpp-python 0.3.36 from its sdist (PyPI has no wheel for it).
#
# About 5 minutes on 2 cores; pip caches the built wheel, so a second run on the same
# machine is instant. GGML_NATIVE=OFF keeps the binary portable; AVX2/FMA/F16C are on
# (any x86-64 CPU from the last decade). Flags from reference/data-models.md section E.
#
# Usage: scripts/install_llama_cpp.sh [PYTHON]   (default: python)
set -euo pipefail
PY="${1:-python}"
VERSION="0.3.36"
if "$PY" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$VERSION' else 1)" 2>/dev/null; then
  echo "llama-cpp-python $VERSION already installed"
  exit 0
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
"$PY" -m pip install "llama-cpp-python==$VERSION"
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed')"
