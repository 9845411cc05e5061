#!/usr/bin/env bash
# Set up everything ember needs on a fresh Debian 12 x86-64 machine (run as root), idempotently:
#   - Debian packages: DLPack headers, GoogleTest, Ninja, and Debian's torch 1.13 stack (the compatibility floor);
#   - a virtual environment (.venv, from the pyenv CPython 3.11) with torch 2.13.0 (the CPU build on disk),
#     the build tools, and oneDNN + oneTBB from PyPI (see docs/architecture.md, "Dependencies", for why these builds).
# Environment: EMBER_VENV (default .venv), EMBER_PYTHON (default python3), EMBER_SKIP_APT=1 to skip apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/deps.sh
source scripts/deps.sh

if [[ "${EMBER_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for pkg in "${EMBER_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if (( ${#missing[@]} )); then
    echo "[setup] apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

venv=${EMBER_VENV:-.venv}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating virtual environment $venv"
  "${EMBER_PYTHON:-python3}" -m venv "$venv"
fi
# Install when any listed requirement is missing or at another version (pip itself would ask the index each time).
if ! "$venv/bin/python" - "${EMBER_PIP_PACKAGES[@]}" <<'PY'
import re, sys
from importlib.metadata import PackageNotFoundError, version
for req in sys.argv[1:]:
    name, pinned = re.match(r"([A-Za-z0-9_.-]+)(?:==([^,;]+))?", req).groups()
    try:
        if pinned and version(name).split("+")[0] != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "[setup] pip install into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${EMBER_PIP_PACKAGES[@]}"
fi
echo "[setup] done: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
