"""Run by the autotune test: reports a throughput that depends only on the layout and allocator it got, so the
best candidate is known: one core an instance scores 10, more score 3; jemalloc adds 1."""

import os
import sys
from pathlib import Path

from ember.launch import autotuning, report_throughput

if not autotuning():  # the final run: record what it was given
    Path(sys.argv[1]).write_text(f"{os.environ['OMP_NUM_THREADS']} {os.environ.get('LD_PRELOAD', '')}")
    sys.exit(0)
value = (10 if os.environ["OMP_NUM_THREADS"] == "1" else 3) + ("jemalloc" in os.environ.get("LD_PRELOAD", ""))
for _ in range(3):
    report_throughput(value, "images/s")
