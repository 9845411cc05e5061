#!/usr/bin/env bash
# Set up, build, and run ember's main demo: examples/demo.py, then examples/quickstart.py under ember-run
# (arguments go to ember-run, e.g. --ninstances 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
"${EMBER_VENV:-.venv}/bin/python" examples/demo.py
# The quickstart: bf16 training, inference optimization and a speed table, run as one tuned ember-run instance.
"${EMBER_VENV:-.venv}/bin/ember-run" "$@" examples/quickstart.py
