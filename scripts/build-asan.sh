#!/usr/bin/env bash
# Build the C++ tests and ember._C under AddressSanitizer + UndefinedBehaviorSanitizer, in build/asan (the core is
# compiled under the sanitizers once, for both). scripts/build.sh --tests runs it after the wheel's build.
# (Run beside the Python passes in CI, to fill the core they leave idle, it made CI longer: 2-core CI is CPU-bound
# there, docs/decisions.md "Graph mode".)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
echo "[build] C++ tests and ember._C under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$PWD/$venv/bin/python" -DEMBER_BUILD_TESTS=ON -DEMBER_SANITIZE=ON -DEMBER_WERROR=ON >/dev/null
cmake --build build/asan -j "${EMBER_JOBS:-$(nproc)}"
