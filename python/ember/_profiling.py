"""ember's kernels by name in torch.profiler: ``kernel_range("adam_step")`` opens the range ``ember::adam_step``
while a profiler records, and costs one check otherwise. Operators defined through ``torch.library``
(``torch.ops.ember.*``) need none: the dispatcher records them, and ember's wrappers take the dispatcher whenever a
profiler runs (``_library.dispatcher_needed``)."""

from __future__ import annotations

import contextlib

import torch

from ember._compat import profiler_enabled

__all__ = ["kernel_range"]

_NOTHING = contextlib.nullcontext()


def kernel_range(name: str) -> contextlib.AbstractContextManager[object]:
    """A profiler range named ``ember::<name>`` around a kernel call, or a no-op context when no profiler runs."""
    if profiler_enabled():
        return torch.autograd.profiler.record_function(f"ember::{name}")
    return _NOTHING
