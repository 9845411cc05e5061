"""How torch tensors reach ember._C: DLPack capsules, the thread budget kept in step with torch, and which fp32
matmul torch itself runs (what the Linear router weighs ember's kernels against).

Every wrapper in the package passes its tensors through :func:`dlpack` and calls :func:`sync_threads` before a
kernel. Both are on the hot path of every op, so they stay small.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Union

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack  # type: ignore[attr-defined]  # not in its __all__

from ember import _C

if TYPE_CHECKING:
    from typing_extensions import CapsuleType
else:  # the PyCapsule type itself (typing_extensions names it from 4.12; Debian 12 has 4.4)
    CapsuleType = type(_to_dlpack(torch.empty(0)))

# What a tensor argument of ember._C takes (its stubs say so): a torch.Tensor, or the DLPack capsule of one.
DLPackTensor = Union[torch.Tensor, CapsuleType]

# torch.utils.dlpack.to_dlpack is a direct C call (about 0.6 us); Tensor.__dlpack__ runs Python-level checks first
# (7 us under torch 2.13) and refuses tensors that require grad, which optimizers must update in place. So no
# wrapper needs .detach() (another 1.5 us) to hand a parameter to a kernel.
dlpack: Callable[[torch.Tensor], CapsuleType] = _to_dlpack


class _ThreadBudget(threading.local):
    # torch's thread count is per thread (OpenMP's per-thread setting, which ember.runtime.pin changes for the
    # pinned thread only), and so is ember's: each thread syncs its own.
    last = -1


_budget = _ThreadBudget()


def sync_threads() -> None:
    """Makes the calling thread's ember budget equal to its ``torch.get_num_threads()`` (set only on a change)."""
    n = torch.get_num_threads()
    if n != _budget.last:
        _C.set_num_threads(n)
        _budget.last = n


def arithmetic_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ember's kernels compute in for tensors of ``dtype`` (ember::arithmetic_dtype): float64 for float64
    (a scalar path in double, there for gradient checks and float64 references), float32 for float32 and bfloat16.
    Per-element side tensors (per-sample weights, batch-norm buffers, boxes) go to the kernels in it."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def require_tensor(op: str, name: str, value: object) -> torch.Tensor:
    """Returns ``value`` if it is a torch.Tensor, else raises a TypeError naming ``op`` and ``name``.

    Everything else about the tensor (device, dtype, shape, layout, aliasing) is checked once, in the binding
    and the core, where the message names the same argument.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def memory_order(x: torch.Tensor) -> list[int] | None:
    """The order of ``x``'s dimensions, outermost in memory first, under which ``x`` is contiguous.

    None when ``x`` is contiguous already or when no order makes it so (gaps or overlaps). A channels-last
    tensor, for one, gives [0, 2, 3, 1]: kernels that need a contiguous array can work on ``x.permute(order)`` and
    leave the layout as it is.
    """
    if x.is_contiguous():
        return None

    def outer_first(d: int) -> tuple[int, int]:
        return -x.stride(d), -x.size(d)

    order = sorted(range(x.dim()), key=outer_first)
    return order if x.permute(order).is_contiguous() else None


@functools.cache
def torch_fp32_matmul_is_mkl_on_intel() -> bool:
    """Whether torch's fp32 matmul is MKL's on an Intel CPU, where MKL takes its fast small-matrix kernels: the only
    fp32 matmul the router's rules for torch were measured against (csrc/linear/linear_route.cpp). Elsewhere, and
    for a torch built on another BLAS (Debian's torch 1.13), ember's kernels take every fp32 call they can."""
    return bool(torch.backends.mkl.is_available()) and _C.cpu_features()["vendor"] == "GenuineIntel"
