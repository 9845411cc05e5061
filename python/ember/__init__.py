"""ember: fast PyTorch on x86 CPUs.

What importing ember does, and all it does: it defines ember's own operators in the ``torch.ops.ember`` namespace
(``torch.library``, so torch.fx and torch.compile see each as one node), and under ember-run it registers one fork
hook, so that forked children such as DataLoader workers run on the instance's CPUs (ember.runtime.child_affinity).
It replaces no torch operator or module, patches nothing, and sets no thread count or other torch setting: a model
runs on ember's kernels only once you call ``ember.optimize`` or use ``ember.nn`` / ``ember.optim`` yourself.
"""

from __future__ import annotations

import torch  # noqa: F401  - loads torch's libgomp before oneDNN's, so the process has one OpenMP runtime

from ember import _C, bf16, distributed, isa, launch, llm, nn, optim, runtime
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
    "llm",
    "nn",
    "optim",
    "optimize",
    "runtime",
    "show_config",
]
