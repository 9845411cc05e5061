#!/usr/bin/env bash
# The property suite (tests/python/hardening) against ember._C built with AddressSanitizer + UBSan, so an
# out-of-bounds read or undefined arithmetic that happens not to crash still fails the run.
#   bash scripts/test-sanitized-python.sh [pytest args]
# Builds ember_core and _C with -fsanitize=address,undefined (build/asan), lays out an importable package
# beside it (the source tree's Python files, the sanitized _C), and runs pytest with the sanitizer runtime preloaded
# (a sanitized module cannot load into an unsanitized python otherwise). Leak detection is off: CPython and torch
# keep their allocations to exit by design. Expects the environment of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
python=${EMBER_TEST_PYTHON:-$PWD/$venv/bin/python}  # another interpreter with torch and pytest: the Xeon host
# scripts/build.sh --tests makes build/asan with the module in it (the core compiled under the sanitizers once);
# without that build, a build of the module alone goes to build/asan-python.
out=build/asan
if ! grep -q "^EMBER_BUILD_PYTHON:BOOL=ON" "$out/CMakeCache.txt" 2>/dev/null; then
  out=build/asan-python
  cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_SANITIZE=ON -DEMBER_BUILD_PYTHON=ON \
    -DEMBER_BUILD_TESTS=OFF -DPython_EXECUTABLE="$python" >/dev/null
fi
cmake --build "$out" -j "${EMBER_JOBS:-$(nproc)}" --target _C

site=$out/site
rm -rf "$site" && mkdir -p "$site/ember"
for entry in python/ember/*; do ln -s "$PWD/$entry" "$site/ember/"; done
ln -s "$PWD/$(ls "$out"/_C*.so)" "$site/ember/"

asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
lib=$("$python" -c "import sys, os; print(os.path.join(sys.prefix, 'lib'))")  # the wheels' libdnnl and libtbb
echo "=== property suite, ember._C under ASan + UBSan ==="
(cd build && LD_PRELOAD="$asan $ubsan" LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$PWD/../$site" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 CUDA_VISIBLE_DEVICES="" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$python" -m pytest -c ../pyproject.toml --rootdir .. -p no:cacheprovider -q --capture=sys ../tests/python/hardening \
  --ignore=../tests/python/hardening/test_launcher_faults.py "$@")
# (ember-run's fault tests stay out: the launcher preloads an allocator into its children in place of the sanitizer
# runtime, and a sanitized module then aborts at import; they run in the ordinary Python passes. --capture=sys:
# a sanitizer writes its report to file descriptor 2 and exits, which pytest's default fd capture would swallow.
# CUDA_VISIBLE_DEVICES="": a CUDA build of torch (the Xeon host's) probing its GPU under ASan's address-space
# reservations warns "out of memory", which the suite's warnings-as-errors would turn into a failure.)
