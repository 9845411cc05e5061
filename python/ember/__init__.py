"""ember: fast PyTorch on x86 CPUs.

Importing ember changes nothing in torch's behaviour: it registers no ops, patches no modules and sets no
thread counts. Everything happens when you call into it. (Under ember-run it registers one fork hook, so that
forked children such as DataLoader workers run on the instance's CPUs: see ember.runtime.child_affinity.)
"""

from __future__ import annotations

import torch  # noqa: F401  - loads torch's libgomp before oneDNN's, so the process has one OpenMP runtime

from ember import _C, bf16, distributed, isa, launch, nn, optim, runtime
from ember._optimize.api import optimize
from ember.config import config, cpu_features, show_config

__version__: str = _C.build_info()["version"]

__all__ = [
    "__version__",
    "bf16",
    "config",
    "cpu_features",
    "distributed",
    "isa",
    "launch",
    "nn",
    "optim",
    "optimize",
    "runtime",
    "show_config",
]
