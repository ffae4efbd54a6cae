#!/usr/bin/env bash
# Build and install llama-cpp-python 0.3.36 from its sdist (PyPI has no wheel for it).
#
# About 5 minutes on 2 cores. pip builds it on the machine that runs it, so by default it
# is built for this CPU (GGML_NATIVE=ON, llama.cpp's own default: AVX-512/VNNI where the
# CPU has them). On this project's 2-core AMD EPYC that makes a 16-token verification
# step 1.3x cheaper than the portable AVX2 build (docs/live.md). AGSPEC_LLAMA_PORTABLE=1
# builds the portable AVX2/FMA/F16C binary instead (reference/data-models.md section E).
#
# The built wheel is kept in ~/.cache/agspec/wheels/<flavour>-<cpu hash>/ so a second run
# on the same machine installs in seconds; pip's own wheel cache is bypassed because its
# key ignores CMAKE_ARGS (it would hand back a wheel built with other flags).
#
# Usage: scripts/install_llama_cpp.sh [PYTHON]   (default: $PYTHON or python3)
set -euo pipefail
PY="${1:-${PYTHON:-python3}}"
VERSION="0.3.36"
COMMON="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
if [ "${AGSPEC_LLAMA_PORTABLE:-0}" = "1" ]; then
  FLAVOUR=portable
  FLAGS="$COMMON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
else
  FLAVOUR=native
  FLAGS="$COMMON -DGGML_NATIVE=ON"
  # On a CPU with AMX, -march=native turns on llama.cpp's AMX matmul kernels, which crash
  # in llama_decode in this version (a segfault on the first token, seen on an AMX Xeon;
  # ggml-org/llama.cpp#20824). Explicit -mno-* flags win over -march=native in GCC, so the
  # build keeps AVX-512/VNNI and leaves AMX out. AGSPEC_LLAMA_AMX=1 keeps AMX.
  if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && [ "${AGSPEC_LLAMA_AMX:-0}" != "1" ]; then
    FLAVOUR=native-noamx
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    FLAGS="$FLAGS -DCMAKE_C_FLAGS='$NOAMX' -DCMAKE_CXX_FLAGS='$NOAMX'"
  fi
fi

# Installed already, with the wanted flavour? A native build on an AVX-512 CPU reports
# "AVX512 = 1" in llama.cpp's system info; the portable build does not; a build without
# AMX does not report "AMX_INT8 = 1".
CPU_AVX512=0
grep -qw avx512f /proc/cpuinfo 2>/dev/null && CPU_AVX512=1
if "$PY" - "$VERSION" "$FLAVOUR" "$CPU_AVX512" <<'PYEOF' 2>/dev/null; then
import sys
import llama_cpp
version, flavour, cpu_avx512 = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
info = llama_cpp.llama_print_system_info().decode()
has_avx512 = "AVX512 = 1" in info
has_amx = "AMX_INT8 = 1" in info
ok = llama_cpp.__version__ == version and (
    flavour == "portable" or has_avx512 or not cpu_avx512
) and not (flavour == "native-noamx" and has_amx)
sys.exit(0 if ok else 1)
PYEOF
  echo "llama-cpp-python $VERSION ($FLAVOUR) already installed"
  exit 0
fi

CPU_KEY=$(grep -m2 -E '^(model name|flags)' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12)
WHEELS="${AGSPEC_CACHE:-$HOME/.cache/agspec}/wheels/llama-cpp-python-$VERSION-$FLAVOUR-$CPU_KEY"
if ! ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $VERSION ($FLAVOUR) from its sdist: about 5 minutes on 2 cores"
  mkdir -p "$WHEELS.tmp"
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" CMAKE_ARGS="$FLAGS" \
    "$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
    "llama-cpp-python==$VERSION" -w "$WHEELS.tmp"
  rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"   # a cut build leaves only the .tmp folder
fi
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
  "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl
"$PY" -m pip install -q --disable-pip-version-check numpy typing-extensions diskcache jinja2
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed:', llama_cpp.llama_print_system_info().decode().strip())"
