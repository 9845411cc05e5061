#!/usr/bin/env bash
# Set up, build, and run ember's main demo (examples/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
"${EMBER_VENV:-.venv}/bin/python" examples/demo.py "$@"
