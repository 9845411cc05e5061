#!/usr/bin/env bash
# Build ember into the virtual environment (pip, through scikit-build-core) and, with --tests, the C++ tests too.
#   scripts/build.sh            the Python package, installed into .venv
#   scripts/build.sh --tests    also build/release (GoogleTest + the C++ example) and build/asan (ASan + UBSan)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
export PATH="$PWD/$venv/bin:$PATH"
jobs=${EMBER_JOBS:-$(nproc)}

echo "[build] ember into $venv"
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python -m pip install -q --no-build-isolation --no-deps . 2>&1 | grep -v "^WARNING: Location" || true
python -c "import ember" || { echo "[build] the installed ember does not import" >&2; exit 1; }

if [[ "${1:-}" == "--tests" ]]; then
  echo "[build] C++ tests and example (build/release)"
  cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_PYTHON=OFF \
    -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_EXAMPLES=ON -DEMBER_WERROR=ON >/dev/null
  cmake --build build/release -j "$jobs"
  # The same build also makes a sanitized ember._C for the property suite (scripts/test-sanitized-python.sh), so
  # the core is compiled under the sanitizers once.
  echo "[build] C++ tests and ember._C under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan)"
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$PWD/$venv/bin/python" -DEMBER_BUILD_TESTS=ON -DEMBER_SANITIZE=ON -DEMBER_WERROR=ON >/dev/null
  cmake --build build/asan -j "$jobs"
fi
