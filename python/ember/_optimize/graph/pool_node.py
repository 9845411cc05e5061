"""The module graph mode puts in place of a max pool: ``max_pool2d`` on ember's kernel (csrc/pool/), and with
``relu`` the ReLU that fed it, applied to the pooled values instead (the same result: see lower_pooling).

Where the kernel does not take the input (another layout or dtype, autograd, a trace recording) it runs torch's
max pool, then torch's ReLU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember._optimize.inference.common import tensors_allow_fast_path
from ember.nn.pooling import max_pool2d_on_kernel


class FusedMaxPool(nn.Module):
    """``max_pool2d(x)``, then ``relu`` of it where the graph's ReLU before the pool was taken in."""

    def __init__(
        self,
        kernel: list[int],
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        ceil_mode: bool,
        relu: bool,
        origin: str,
    ) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        self.ceil_mode = ceil_mode
        self.relu = relu
        self.origin = origin

    def forward(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and tensors_allow_fast_path((), x):
            out = max_pool2d_on_kernel(x, self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode,
                                       self.relu)  # fmt: skip
            if out is not None:
                return out
        pooled = F.max_pool2d(x, self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode)
        return torch.relu(pooled) if self.relu else pooled

    def extra_repr(self) -> str:
        return (f"kernel={self.kernel}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"ceil_mode={self.ceil_mode}, relu={self.relu}, origin={self.origin}")  # fmt: skip
