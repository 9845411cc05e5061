#!/usr/bin/env bash
# Set up, build and run every test of ember:
#   1. the C++ tests (GoogleTest via ctest), in a release build and under ASan + UBSan;
#   2. the Python tests under the virtual environment's torch 2.13;
#   3. the same Python tests against the same built extension under Debian's torch 1.13 (/usr/bin/python3):
#      one build serves every torch, because the C++ core never links libtorch;
#   4. the property suite (tests/python/hardening) against ember._C built with ASan + UBSan, with 16 threads.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
bash scripts/setup.sh

echo "=== lint (ruff) ==="
"$venv/bin/ruff" check python tests benchmarks examples
"$venv/bin/ruff" format --check python tests benchmarks examples

bash scripts/build.sh --tests

echo "=== C++ tests (release) ==="
ctest --test-dir build/release --output-on-failure -j "$(nproc)"
# A thread budget well above this machine's cores: the chunking and partitioning of every parallel loop meets the
# splits a 16-core host makes, which 2 cores never reach.
echo "=== C++ tests (release, 16 threads) ==="
OMP_NUM_THREADS=16 ctest --test-dir build/release --output-on-failure -j "$(nproc)"
echo "=== C++ tests (ASan + UBSan) ==="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j "$(nproc)"

echo "=== C++ example ==="
build/release/examples/cpp/bf16_roundtrip

# pytest runs from outside the source tree so that `import ember` finds the installed package, not python/ember.
echo "=== Python tests, torch 2.13 ($venv) ==="
(cd build && "../$venv/bin/python" -m pytest -c ../pyproject.toml --rootdir .. ../tests/python "$@")

echo "=== Python tests, Debian's torch 1.13 (/usr/bin/python3), same extension ==="
site=$("$venv/bin/python" -c "import ember, os; print(os.path.dirname(os.path.dirname(ember.__file__)))")
mkdir -p build/torch-floor
ln -sfn "$site/ember" build/torch-floor/ember
(cd build && PYTHONPATH="$PWD/torch-floor" /usr/bin/python3 -m pytest -c ../pyproject.toml --rootdir .. \
  -p no:cacheprovider ../tests/python "$@")

echo "=== property suite under ASan + UBSan, 16 threads ==="
OMP_NUM_THREADS=16 bash scripts/test-sanitized-python.sh "$@"
