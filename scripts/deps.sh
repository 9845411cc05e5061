# What ember builds and tests against: one list, read by scripts/setup.sh and by the offline bundle for hosts
# without a package index (scripts/device-bundle.sh).
# shellcheck disable=SC2034
EMBER_APT_PACKAGES=(
  libdlpack-dev libgtest-dev ninja-build
  python3-torch python3-torchvision python3-numpy python3-pytest python3-hypothesis
  python3-sklearn  # the digits data set of the convergence tests
  numactl libjemalloc2 libtcmalloc-minimal4  # what ember-run binds instances with and the allocators it preloads
)
# oneDNN 3.2, CPU only, built by GCC on GNU OpenMP (docs/architecture.md, "Dependencies", says why this build);
# oneTBB 2021.13 for ember's own parallel loops.
EMBER_ONEDNN_PACKAGES=(onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 tbb==2021.13.1 tbb-devel==2021.13.1)
# What the tests need beside ember's own dependencies: the clean environment scripts/test.sh installs the wheel into.
EMBER_TEST_PACKAGES=(
  torch==2.13.0 pytest hypothesis scikit-learn
  transformers==5.23.0  # real architectures for the inference tests (built from configs, no hub)
)
# The development environment (.venv): the tests' packages, the build (python -m build through scikit-build-core),
# the style checks (scripts/lint.sh) and the documentation (docs/, Sphinx).
EMBER_PIP_PACKAGES=(
  "${EMBER_TEST_PACKAGES[@]}" numpy
  build==1.6.1 pybind11==3.1.0 "scikit-build-core>=0.10" "cmake>=3.24" ninja  # pybind11 pinned: _C.pyi is its output
  "${EMBER_ONEDNN_PACKAGES[@]}"
  ruff==0.17.6 mypy==2.4.1 pybind11-stubgen==3.0.0 import-linter==2.16 clang-format==23.1.3 clang-tidy==23.1.4
  pre-commit==4.7.0
  sphinx==9.0.4 furo==2025.12.19 myst-parser==5.2.0 matplotlib==3.11.2
)
