"""How torch tensors reach ember._C: DLPack capsules, and the thread budget kept in step with torch.

Every wrapper in the package passes its tensors through :func:`dlpack` and calls :func:`sync_threads` before a
kernel. Both are on the hot path of every op, so they stay small.
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack

from ember import _C

# torch.utils.dlpack.to_dlpack is a direct C call (about 1 us); Tensor.__dlpack__ runs Python-level checks first
# (7 us under torch 2.13) and refuses tensors that require grad, which optimizers must update in place.
dlpack = _to_dlpack

_last_threads = -1


def sync_threads() -> None:
    """Makes ember's thread budget equal to ``torch.get_num_threads()`` (changed only when torch's changed)."""
    global _last_threads
    n = torch.get_num_threads()
    if n != _last_threads:
        _C.set_num_threads(n)
        _last_threads = n


def require_tensor(op: str, name: str, value: object) -> torch.Tensor:
    """Returns ``value`` if it is a CPU tensor, else raises a TypeError/ValueError naming ``op`` and ``name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type != "cpu":
        raise ValueError(f"{op}: {name} must be a CPU tensor, got a tensor on {value.device}")
    return value
