"""The module graph mode puts in place of a squeeze-excitation's product ``x * scale``: the features times a
per-sample, per-channel scale a fused convolution computed from them (torchvision's MobileNetV3, EfficientNet and
RegNet blocks), on ember's kernel (``ember::multiply``, csrc/epilogue/multiply.cpp), where torch's mul ran between two
of ember's kernels and cut the replayed segments around it.

Where the two operands have one dtype (float32 or bfloat16) and one broadcasts to the other's shape, the kernel
writes the product like the larger operand (its layout kept, as torch's mul keeps it), each element rounded once, as
torch rounds it: the same bits. Anything else (dtypes that promote, shapes that broadcast both ways, autograd, a
trace) runs torch's ``a * b``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember import _C
from ember._optimize.graph.fast_calls import RECORDING
from ember._optimize.inference.common import is_dense, tensors_allow_fast_path
from ember._tensor import dlpack, sync_threads

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class FusedProduct(nn.Module):
    """``a * b``, one operand broadcasting to the other's shape."""

    def __init__(self, origin: str) -> None:
        super().__init__()
        self.origin = origin

    def forward(self, a: Any, b: Any) -> Any:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tensors_allow_fast_path((b,), a):
            out = self._on_kernel(a, b)
            if out is not None:
                return out
        return a * b

    def _on_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        if a.dtype != b.dtype or a.dtype not in _KERNEL_DTYPES or not (a.is_cpu and b.is_cpu):
            return None
        if b.dim() <= a.dim() and _broadcasts(b.shape, a.shape):
            x, factor = a, b
        elif a.dim() <= b.dim() and _broadcasts(a.shape, b.shape):
            x, factor = b, a
        else:
            return None
        if x.numel() == 0 or not is_dense(x):
            return None
        factor = factor.expand(x.shape)
        out = torch.empty_like(x)  # (x's layout, as torch's mul gives it)
        sync_threads()
        _C.multiply(dlpack(x), dlpack(factor), dlpack(out))
        recorder = RECORDING.active
        if recorder is not None:
            recorder.multiply(x, factor, out)
        return out

    def extra_repr(self) -> str:
        return self.origin


def _broadcasts(small: torch.Size, large: torch.Size) -> bool:
    """Whether ``small`` broadcasts to ``large`` (aligned right, each size 1 or equal)."""
    offset = len(large) - len(small)
    return all(s == 1 or s == large[offset + i] for i, s in enumerate(small))
