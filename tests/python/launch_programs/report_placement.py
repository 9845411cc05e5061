"""Run by the launcher tests: prints where this instance runs, as the OS and torch see it, as one JSON line."""

import json
import os
import sys

import torch

print(
    json.dumps(
        {
            "affinity": sorted(os.sched_getaffinity(0)),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "omp_places": os.environ.get("OMP_PLACES"),
            "torch_threads": torch.get_num_threads(),
            "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "args": sys.argv[1:],
        }
    )
)
exit_code = int(os.environ.get("EXIT_IF_CORE_" + str(min(os.sched_getaffinity(0))), "0"))
sys.exit(exit_code)
