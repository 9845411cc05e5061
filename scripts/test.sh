#!/usr/bin/env bash
# Set up, build and run every test of ember:
#   0. the style checks (scripts/lint.sh: ruff, mypy, import contracts, clang-format, clang-tidy) and the
#      documentation build (Sphinx, warnings as errors);
#   1. the C++ tests (GoogleTest via ctest), in a release build and under ASan + UBSan;
#   2. the Python tests under torch 2.13, against the wheel installed into a clean virtual environment;
#   3. the same Python tests against the same installed wheel under Debian's torch 1.13 (/usr/bin/python3):
#      one build serves every torch, because the C++ core never links libtorch;
#   4. the property suite (tests/python/hardening) against ember._C built with ASan + UBSan, with 16 threads.
# Steps 2 to 4 and clang-tidy run side by side, each into its own log under build/.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
stage() { echo "=== $1 (at ${SECONDS} s) ==="; }  # the elapsed time keeps CI's 30-minute budget visible
bash scripts/setup.sh
# shellcheck source=scripts/deps.sh
source scripts/deps.sh

# Style first (seconds); clang-tidy, minutes on two cores, runs beside the single-threaded torch 1.13 tests below.
bash scripts/lint.sh --fast

bash scripts/build.sh --tests
# The stubs mypy checks against (python/ember/_C.pyi) are the built module's, regenerated and compared.
bash scripts/stubs.sh --check

stage "C++ tests (release)"
ctest --test-dir build/release --output-on-failure -j "$(nproc)"
# A thread budget well above this machine's cores: the chunking and partitioning of every parallel loop meets the
# splits a 16-core host makes, which 2 cores never reach.
stage "C++ tests (release, 16 threads)"
OMP_NUM_THREADS=16 ctest --test-dir build/release --output-on-failure -j "$(nproc)"
stage "C++ tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j "$(nproc)"

stage "C++ example"
build/release/examples/cpp/bf16_roundtrip

stage "documentation (Sphinx, warnings as errors)"
"$venv/bin/python" -m sphinx -W --keep-going -q -b html docs build/docs

# The artifact users get is the one tested: the wheel scripts/build.sh made, installed with pip and its
# dependencies from the package index (oneDNN and oneTBB from their PyPI wheels) into a clean virtual environment.
stage "the wheel, installed into a clean virtual environment"
clean=build/clean-venv
rm -rf "$clean"
"${EMBER_PYTHON:-python3}" -m venv "$clean"
"$clean/bin/python" -m pip install -q --no-compile "$(ls dist/ember-*.whl)" "${EMBER_TEST_PACKAGES[@]}" 2>&1 \
  | grep -v "^WARNING: Location" || true

# The Python passes run side by side, with clang-tidy beside them: Debian's torch 1.13 computes on one thread and
# the others leave gaps, so together they keep both cores busy (one after the other they pushed CI past 30
# minutes). Each writes its own log, printed when it ends. pytest runs from outside the source tree so that
# `import ember` finds the installed package, not python/ember.
stage "Python tests under torch 2.13 and Debian's torch 1.13, the sanitized property suite and clang-tidy, side by side"
site=$("$clean/bin/python" -c "import ember, os; print(os.path.dirname(os.path.dirname(ember.__file__)))")
mkdir -p build/torch-floor
ln -sfn "$site/ember" build/torch-floor/ember
(cd build && "../$clean/bin/python" -m pytest -c ../pyproject.toml --rootdir .. -p no:cacheprovider ../tests/python \
  "$@") >build/pytest-torch2.log 2>&1 &
torch2=$!
# Debian's python has no oneDNN or oneTBB wheels of its own: it borrows the clean environment's.
(cd build && PYTHONPATH="$PWD/torch-floor" LD_LIBRARY_PATH="$PWD/../$clean/lib" /usr/bin/python3 -m pytest \
  -c ../pyproject.toml --rootdir .. -p no:cacheprovider ../tests/python "$@") >build/pytest-torch1.log 2>&1 &
torch1=$!
EMBER_TIDY_JOBS=1 bash scripts/lint.sh --tidy >build/clang-tidy.log 2>&1 &
tidy=$!
# The property suite (tests/python/hardening) against ember._C built with ASan + UBSan, with a thread budget of 16.
OMP_NUM_THREADS=16 bash scripts/test-sanitized-python.sh "$@" >build/pytest-sanitized.log 2>&1 &
sanitized=$!
failed=0
for job in "torch2:$torch2:build/pytest-torch2.log:the installed wheel ($clean), torch 2.13" \
           "torch1:$torch1:build/pytest-torch1.log:the same wheel under /usr/bin/python3, torch 1.13" \
           "tidy:$tidy:build/clang-tidy.log:clang-tidy" \
           "sanitized:$sanitized:build/pytest-sanitized.log:the property suite under ASan + UBSan, 16 threads"; do
  IFS=: read -r _ pid log what <<<"$job"
  if wait "$pid"; then
    echo "--- $what (at ${SECONDS} s)"
    tail -3 "$log"
  else
    echo "--- $what FAILED (at ${SECONDS} s)"
    cat "$log"
    failed=1
  fi
done
(( failed == 0 )) || exit 1
echo "scripts/test.sh: everything passed in ${SECONDS} s"
