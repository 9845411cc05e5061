"""The module graph mode puts in place of a rotary position embedding in the rotate-half form: ``x * cos +
cat(-x[..., h:], x[..., :h]) * sin`` on ember's kernel (csrc/rope/), one pass instead of the graph's seven
operations.

As the other fused nodes, it keeps the operations it replaced as a GraphModule of ``(x, cos, sin)`` (``original``):
its fallback (autograd, float64 or float16, shapes the kernel does not take) and the source of the result's dtype
(``x * cos`` promotes: a bf16 query times fp32 tables is fp32), probed once per combination of dtypes and autocast
state. The result is laid out as x is (a query transposed to [b, h, l, d] from [b, l, h, d] memory stays so), as
torch's elementwise operations lay theirs out.

Under a bf16 autocast a bf16 query times Hugging Face's fp32 tables is fp32, which the attention after it converts
to bf16 before anything else (autocast runs attention in bf16): where fused attention nodes are the only readers
(``for_attention``, set by the attention pass), the kernel writes bf16 at once. The values are the same (the fp32
result rounded once), and the conversion's pass over the query and the key is saved.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember import _C
from ember._optimize.graph.fast_calls import RECORDING
from ember._optimize.graph.probe import KERNEL_DTYPES, one_element, result_dtype
from ember._optimize.inference.common import cpu_autocast_dtype, tensors_allow_fast_path
from ember._tensor import dlpack, sync_threads


class FusedRope(nn.Module):
    """``x * cos + rotate_half(x) * sin``, x's last dimension split in two at ``split`` (the graph's slice bound)."""

    def __init__(self, original: fx.GraphModule, split: int, origin: str) -> None:
        super().__init__()
        self.original = original  # (x, cos, sin) -> result
        self.split = split
        self.origin = origin
        self.for_attention = False  # only fused attention reads the result: under bf16 autocast, write bf16
        self._plans: dict[tuple[Any, ...], torch.dtype | None] = {}

    def forward(self, x: Any, cos: Any, sin: Any) -> Any:
        tensors = isinstance(x, torch.Tensor) and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)
        if tensors and tensors_allow_fast_path((cos, sin), x):
            out = self._on_kernel(x, cos, sin)
            if out is not None:
                return out
        return self.original(x, cos, sin)

    def _on_kernel(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
        key = (x.dtype, cos.dtype, sin.dtype, cpu_autocast_dtype())
        if key in self._plans:
            dtype = self._plans[key]
        else:
            dtype = self._plans[key] = self._plan(x, cos, sin)
            if dtype == torch.float32 and self.for_attention and key[3] == torch.bfloat16:
                dtype = self._plans[key] = torch.bfloat16
        if dtype is None or not (x.is_cpu and cos.is_cpu and sin.is_cpu):
            return None
        dims = x.dim()
        features = 2 * self.split
        if not 1 <= dims <= 4 or x.shape[-1] != features or cos.dim() > 4 or sin.dim() > 4 or x.numel() == 0:
            return None
        if cos.shape[-1] != features or sin.shape[-1] != features or not _broadcasts(cos, x) or not _broadcasts(sin, x):
            return None
        if x.stride(-1) != 1:
            x = x.contiguous()
        if cos.stride(-1) != 1:
            cos = cos.contiguous()
        if sin.stride(-1) != 1:
            sin = sin.contiguous()
        out = torch.empty_like(x, dtype=dtype)  # x's layout (dense: a dense x's strides, else contiguous)
        if out.stride(-1) != 1:
            out = torch.empty(x.shape, dtype=dtype)
        lead = (None,) * (4 - dims)
        x4, out4 = (x[lead], out[lead]) if lead else (x, out)
        sync_threads()
        _C.rotary_embedding(dlpack(x4), dlpack(cos), dlpack(sin), dlpack(out4))
        recorder = RECORDING.active
        if recorder is not None:
            recorder.rotary_embedding(x4, cos, sin, out4)
        return out

    def _plan(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.dtype | None:
        """The result's dtype for operands of these dtypes (under the autocast now), where the kernel takes them."""
        if x.dtype not in KERNEL_DTYPES or cos.dtype not in KERNEL_DTYPES or cos.dtype != sin.dtype:
            return None
        return result_dtype(self.original, *(one_element(t, t.dim() - 1) for t in (x, cos, sin)))

    def extra_repr(self) -> str:
        return f"{self.origin}: rotate-half rotary embedding of {2 * self.split} features"


def _broadcasts(table: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``table`` broadcasts to ``x``'s shape with its last dimension x's own."""
    dims = table.dim()
    if dims > x.dim():
        return False
    offset = x.dim() - dims
    for d in range(dims - 1):
        size = table.shape[d]
        if size != 1 and size != x.shape[offset + d]:
            return False
    return True
