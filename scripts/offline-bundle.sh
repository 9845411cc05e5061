#!/usr/bin/env bash
# Collect what a host with no package index needs to build and test ember (the 16-core Xeon test machine):
# the oneDNN and oneTBB wheels of scripts/deps.sh and the DLPack, GoogleTest, jemalloc and tcmalloc .deb files, into DIR
# (default .device/, which .gitignore ignores). Then, on that host: bash scripts/offline-test.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/deps.sh
source scripts/deps.sh
dir=${1:-.device}
mkdir -p "$dir/whl" "$dir/deb"
python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "${PYVER:-3.12}" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$dir/whl" "${EMBER_ONEDNN_PACKAGES[@]}" 2>&1 | grep -v "^WARNING: Location" || true
(cd "$dir/deb" && apt-get download libdlpack-dev libgtest-dev libjemalloc2 libtcmalloc-minimal4 2>&1 | grep -v "unsandboxed" || true)
du -sh "$dir"
