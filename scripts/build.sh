#!/usr/bin/env bash
# Build ember's sdist and wheel (python -m build, through scikit-build-core) into dist/, install that wheel into the
# virtual environment, and with --tests build the C++ tests too.
#   scripts/build.sh            dist/ember-*.tar.gz and dist/ember-*.whl; the wheel installed into .venv
#   scripts/build.sh --tests    the wheel's build (build/release) also makes the C++ tests and example, and
#                               build/asan makes them and ember._C under ASan + UBSan
# The wheel is what users install and what scripts/test.sh tests; it finds oneDNN and oneTBB through its RPATH,
# in the lib/ of the environment their PyPI wheels install into. Its build tree is build/release (pyproject.toml),
# so the C++ tests link the very objects the wheel holds: the core is compiled once per configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
export PATH="$PWD/$venv/bin:$PATH"
jobs=${EMBER_JOBS:-$(nproc)}

mkdir -p build
echo "[build] sdist and wheel into dist/"
rm -f dist/ember-*
# Both from the source tree (not the wheel from the unpacked sdist), so that build/release stays incremental.
defines=()
if [[ "${1:-}" == "--tests" ]]; then
  defines=(-Ccmake.define.EMBER_BUILD_TESTS=ON -Ccmake.define.EMBER_BUILD_EXAMPLES=ON -Ccmake.define.EMBER_WERROR=ON)
fi
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python -m build --no-isolation --sdist --wheel --outdir dist "${defines[@]}" . \
  >build/wheel.log 2>&1 || { cat build/wheel.log >&2; exit 1; }
wheel=$(ls dist/ember-*.whl)
echo "[build] $wheel into $venv"
python -m pip install -q --no-deps --force-reinstall "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import ember" || { echo "[build] the installed ember does not import" >&2; exit 1; }

if [[ "${1:-}" == "--tests" ]]; then
  echo "[build] C++ tests and example: built with the wheel, in build/release"
  bash scripts/build-asan.sh
fi
