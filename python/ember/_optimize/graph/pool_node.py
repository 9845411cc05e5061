"""The modules graph mode puts in place of a pool, on ember's kernels (csrc/pool/): ``FusedMaxPool`` (with
``relu``, the ReLU that fed it applied to the pooled values instead: the same result, see lower_pooling),
``FusedAvgPool`` and ``FusedAdaptiveAvgPool``.

Where the kernel does not take the input (another layout or dtype, autograd, a trace recording; for an adaptive
average, an output size that does not divide the input's) each runs torch's function (then torch's ReLU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember._optimize.graph.fast_calls import RECORDING
from ember._optimize.inference.common import tensors_allow_fast_path
from ember.nn.pooling import adaptive_window, avg_pool2d_on_kernel, max_pool2d_on_kernel


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
                recorder = RECORDING.active
                if recorder is not None:
                    recorder.max_pool2d(_batched(x), self.kernel, self.stride, self.padding, self.dilation,
                                        self.ceil_mode, self.relu, _batched(out))  # fmt: skip
                return out
        pooled = F.max_pool2d(x, self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode)
        return torch.relu(pooled) if self.relu else pooled

    def extra_repr(self) -> str:
        return (f"kernel={self.kernel}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"ceil_mode={self.ceil_mode}, relu={self.relu}, origin={self.origin}")  # fmt: skip


class FusedAvgPool(nn.Module):
    """``avg_pool2d(x)`` with a window fixed in the graph."""

    def __init__(
        self,
        kernel: list[int],
        stride: list[int],
        padding: list[int],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
        origin: str,
    ) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding = kernel, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override
        self.origin = origin

    def forward(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and tensors_allow_fast_path((), x):
            out = avg_pool2d_on_kernel(x, self.kernel, self.stride, self.padding, self.ceil_mode,
                                       self.count_include_pad, self.divisor_override)  # fmt: skip
            if out is not None:
                recorder = RECORDING.active
                if recorder is not None:
                    recorder.avg_pool2d(_batched(x), self.kernel, self.stride, self.padding, self.ceil_mode,
                                        self.count_include_pad, self.divisor_override or 0, _batched(out))  # fmt: skip
                return out
        return F.avg_pool2d(x, self.kernel, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"kernel={self.kernel}, stride={self.stride}, padding={self.padding}, ceil_mode={self.ceil_mode}, "
                f"count_include_pad={self.count_include_pad}, divisor_override={self.divisor_override}, "
                f"origin={self.origin}")  # fmt: skip


class FusedAdaptiveAvgPool(nn.Module):
    """``adaptive_avg_pool2d(x, output_size)``: on the kernel where each output size divides the input's (every
    classifier head's and squeeze-excitation's global pool)."""

    def __init__(self, output_size: Any, origin: str) -> None:
        super().__init__()
        self.output_size = output_size
        self.origin = origin

    def forward(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and tensors_allow_fast_path((), x):
            window = adaptive_window(x, self.output_size)
            if window is not None:
                out = avg_pool2d_on_kernel(x, window, window, [0, 0], False)
                if out is not None:
                    recorder = RECORDING.active
                    if recorder is not None:
                        recorder.avg_pool2d(_batched(x), window, window, [0, 0], False, True, 0, _batched(out))
                    return out
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, origin={self.origin}"


def _batched(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernel read or wrote it: an unbatched [C, H, W] as a batch of one (a view)."""
    return t if t.dim() == 4 else t.unsqueeze(0)
