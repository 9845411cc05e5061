#!/usr/bin/env bash
# Build and test ember on a host that has Python, torch, pybind11, scikit-build-core, CMake, ninja, pytest and
# hypothesis but no package index, from the bundle of scripts/offline-bundle.sh:
#   bash scripts/offline-test.sh BUNDLE [--bench OUTDIR]
# Runs the C++ tests (release and ASan + UBSan), the C++ example, the Python tests and the property suite against a
# sanitized ember._C (scripts/test-sanitized-python.sh), and with --bench the
# benchmarks (EMBER_BENCHES="optim bf16" picks some), copying their results to OUTDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=$(realpath "${1:?usage: offline-test.sh BUNDLE [--bench OUTDIR]}")
prefix=/tmp/ember-deps
python3 -m pip install -q --no-index --no-deps --no-compile --prefix "$prefix" "$bundle"/whl/*.whl
for f in "$bundle"/deb/*.deb; do dpkg -x "$f" "$prefix"; done
export CMAKE_PREFIX_PATH="$prefix:$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"
# lib: the wheels' oneDNN and oneTBB; usr/lib/x86_64-linux-gnu: the .debs' jemalloc and tcmalloc, for ember-run.
export LD_LIBRARY_PATH="$prefix/lib:$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
jobs=$(nproc)
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"

site=/tmp/ember-site
rm -rf "$site"
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install -q --no-build-isolation --no-deps --target "$site" \
  --config-settings=cmake.define.CMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH" .
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

for kind in release asan; do
  flags=(-DEMBER_BUILD_PYTHON=OFF -DEMBER_BUILD_TESTS=ON -DEMBER_WERROR=ON)
  [[ $kind == release ]] && flags+=(-DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_EXAMPLES=ON)
  [[ $kind == asan ]] && flags+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_SANITIZE=ON)
  cmake -S . -B "build/offline-$kind" -G Ninja "${flags[@]}" -DGTest_DIR="$prefix/usr/lib/x86_64-linux-gnu/cmake/GTest" >/dev/null
  cmake --build "build/offline-$kind" -j "$jobs" >/dev/null
  echo "=== C++ tests ($kind) ==="
  ctest --test-dir "build/offline-$kind" --output-on-failure -j "$jobs" | tail -3
done
build/offline-release/examples/cpp/bf16_roundtrip
echo "=== Python tests ==="
(cd build && python3 -m pytest -c ../pyproject.toml --rootdir .. -p no:cacheprovider -q ../tests/python)
echo "=== property suite under ASan + UBSan ==="
EMBER_TEST_PYTHON=$(command -v python3) bash scripts/test-sanitized-python.sh

if [[ "${2:-}" == "--bench" ]]; then
  out=${3:?--bench needs OUTDIR}
  for b in ${EMBER_BENCHES:-dlpack bf16 threading optim}; do
    echo "=== benchmark $b ==="
    python3 "benchmarks/bench_$b.py"
  done
  mkdir -p "$out" && cp benchmarks/results/*intel* "$out"/ 2>/dev/null || cp benchmarks/results/* "$out"/
fi
