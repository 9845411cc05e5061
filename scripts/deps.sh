# What ember builds and tests against: one list, read by scripts/setup.sh and by the offline bundle for hosts
# without a package index (scripts/device-bundle.sh).
# shellcheck disable=SC2034
EMBER_APT_PACKAGES=(
  libdlpack-dev libgtest-dev ninja-build
  python3-torch python3-torchvision python3-numpy python3-pytest python3-hypothesis
  python3-sklearn  # the digits data set of the convergence tests
  numactl libjemalloc2 libtcmalloc-minimal4  # what ember-run binds instances with and the allocators it preloads
)
# oneDNN 3.2, CPU only, built by GCC on GNU OpenMP (docs/DESIGN.md, "Dependencies", says why this build);
# oneTBB 2021.13 for ember's own parallel loops.
EMBER_ONEDNN_PACKAGES=(onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 tbb==2021.13.1 tbb-devel==2021.13.1)
EMBER_PIP_PACKAGES=(
  torch==2.13.0 numpy pytest hypothesis ruff scikit-learn
  transformers==5.23.0  # real architectures for the inference tests (built from configs, no hub)
  "pybind11>=2.11" "scikit-build-core>=0.10" "cmake>=3.24" ninja
  "${EMBER_ONEDNN_PACKAGES[@]}"
)
