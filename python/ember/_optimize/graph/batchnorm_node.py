"""The module graph mode puts in place of an eval-mode BatchNorm that no layer before it takes in (a pre-activation
block's: DenseNet normalizes the concatenation of every earlier layer's features, then applies its ReLU, then the
convolution): ``x * scale + shift`` per channel on ember's kernel (csrc/norm/), in x's layout, and with ``relu`` the
ReLU after it in the same pass.

The statistics and affine tensors are read where they live on every call (``FoldedBatchNorm``'s refs), so a loaded
state dict or a replaced parameter is seen as the module's forward would see it. The result has x's dtype, as
torch's CPU batch norm gives a bf16 activation beside fp32 statistics. Anything else (float64 or float16, tensors of
other dtypes, a tensor that wants a gradient, a trace recording) runs torch's batch norm, then torch's ReLU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._optimize.graph.fast_calls import RECORDING
from ember._optimize.inference.common import tensors_allow_fast_path
from ember._optimize.inference.state import FoldedBatchNorm
from ember._tensor import dlpack, sync_threads

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class FusedBatchNorm(nn.Module):
    """``batch_norm(x)`` with running statistics, then ``relu`` of it where the graph's ReLU after it was taken in."""

    def __init__(self, norm: FoldedBatchNorm, relu: bool, origin: str) -> None:
        super().__init__()
        self.norm = norm
        self.relu = relu
        self.origin = origin
        self._defaults: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # ones and zeros per channel count

    def forward(self, x: Any) -> Any:
        weight, bias, mean, var = self.norm.tensors()
        statistics = mean is not None and var is not None
        if isinstance(x, torch.Tensor) and statistics and tensors_allow_fast_path((weight, bias, mean, var), x):
            out = self._on_kernel(x, weight, bias, mean, var)  # type: ignore[arg-type]
            if out is not None:
                return out
        out = F.batch_norm(x, mean, var, weight, bias, False, 0.0, self.norm.eps)
        return torch.relu(out) if self.relu else out

    def _on_kernel(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        if not x.is_cpu or x.dtype not in _KERNEL_DTYPES or x.dim() < 2 or x.numel() == 0:
            return None
        channels = x.shape[1]
        if weight is None or bias is None:
            ones, zeros = self._defaults.get(channels) or (torch.ones(channels), torch.zeros(channels))
            self._defaults[channels] = (ones, zeros)
            weight = ones if weight is None else weight
            bias = zeros if bias is None else bias
        for t in (weight, bias, mean, var):
            if t.dtype != torch.float32 or not t.is_cpu or t.shape != (channels,) or not t.is_contiguous():
                return None
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        if not (x.is_contiguous() or channels_last):
            return None
        out = torch.empty_like(x)  # x's dtype and layout
        sync_threads()
        _C.frozen_batch_norm(dlpack(x), dlpack(weight), dlpack(bias), dlpack(mean), dlpack(var), self.norm.eps,
                             dlpack(out), relu=self.relu)  # fmt: skip
        recorder = RECORDING.active
        if recorder is not None:
            norm = self.norm
            refs = (norm.weight, norm.bias, norm.running_mean, norm.running_var)
            recorder.batch_norm(x, (weight, bias, mean, var), refs, norm.eps, self.relu, out)
        return out

    def extra_repr(self) -> str:
        return f"eps={self.norm.eps}, relu={self.relu}, origin={self.origin}"
