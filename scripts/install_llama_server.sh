#!/usr/bin/env bash
# Build llama.cpp's own HTTP server (`llama-server`) from the source vendored in the
# llama-cpp-python 0.3.36 sdist: the same llama.cpp the `llama_cpp` module links, so the
# peer benchmark (benchmarks/bench_serve_peers.py) compares servers, not llama.cpp versions.
#
# About 20 minutes on 2 busy cores (one compile job, at the lowest priority, so the rest of
# the machine stays usable). The binary is cached in ~/.cache/agspec/llama-server/<cpu hash>/
# and a second run returns at once. It is built for this CPU (GGML_NATIVE=ON), as
# scripts/install_llama_cpp.sh builds the Python module; AGSPEC_LLAMA_PORTABLE=1 builds the
# portable AVX2/FMA/F16C flavour instead.
#
# Usage: scripts/install_llama_server.sh [PYTHON]   (default: $PYTHON or python3)
# Prints the path of the binary on its last line.
set -euo pipefail
PY="${1:-${PYTHON:-python3}}"
VERSION="0.3.36"
JOBS="${AGSPEC_BUILD_JOBS:-1}"
if [ "${AGSPEC_LLAMA_PORTABLE:-0}" = "1" ]; then
  FLAVOUR=portable
  FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
else
  FLAVOUR=native
  FLAGS="-DGGML_NATIVE=ON"
  NOAMX=""
  # AMX kernels off on an AMX CPU, as scripts/install_llama_cpp.sh does (they crash in
  # this llama.cpp version); AGSPEC_LLAMA_AMX=1 keeps them.
  if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && [ "${AGSPEC_LLAMA_AMX:-0}" != "1" ]; then
    FLAVOUR=native-noamx
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  fi
fi
CPU_KEY=$(grep -m2 -E '^(model name|flags)' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12)
ROOT="${AGSPEC_CACHE:-$HOME/.cache/agspec}/llama-server"
DEST="$ROOT/$VERSION-$FLAVOUR-$CPU_KEY"
if [ -x "$DEST/llama-server" ]; then
  echo "llama-server ($VERSION, $FLAVOUR) already built"
  echo "$DEST/llama-server"
  exit 0
fi

WORK="$ROOT/build-$VERSION-$FLAVOUR-$CPU_KEY"
mkdir -p "$WORK"
SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  echo "downloading the llama-cpp-python $VERSION sdist"
  # Only this package from source (--no-binary :all: would also build pip's own build
  # tools, cmake included, from source just to read the sdist's metadata).
  "$PY" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python --no-build-isolation "llama-cpp-python==$VERSION" -d "$WORK/dl"
  mv "$WORK"/dl/llama_cpp_python-"$VERSION".tar.gz "$SDIST"
fi
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  tar -xzf "$SDIST" -C "$WORK"
fi
echo "building llama-server ($FLAVOUR, $JOBS job(s), nice 19): about 20 minutes on 2 cores"
# shellcheck disable=SC2086
nice -n 19 cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DBUILD_SHARED_LIBS=OFF $FLAGS ${NOAMX:+"-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX"} \
  >"$WORK/cmake.log"
nice -n 19 cmake --build "$WORK/build" --target llama-server -j"$JOBS" >"$WORK/build.log"
mkdir -p "$DEST.tmp"
cp "$WORK/build/bin/llama-server" "$DEST.tmp/"
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"   # a cut build leaves no half-made binary in $DEST
"$DEST/llama-server" --version 2>&1 | head -n 3 || true
echo "$DEST/llama-server"
