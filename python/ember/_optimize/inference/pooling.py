"""Pools onto ember's kernels for the module-level rewrite: ``nn.MaxPool2d``, ``nn.AvgPool2d`` and
``nn.AdaptiveAvgPool2d`` get an installed forward that runs ``ember.nn.functional``'s pool with the module's
settings (the kernel for a channels-last float32 or bf16 input, torch's pool otherwise). The modules keep their
classes, so a graph captured from them later still sees torch's modules, and TorchScript's twin, which drops
installed forwards, compiles torch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember._optimize.inference.common import class_forward, fast_path_allowed, install_forwards
from ember.nn.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d


class PoolForward:
    """The installed forward of a torch pooling module (see the module docstring)."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> Any:  # noqa: A002 - torch's name
        m: Any = self.module
        if not isinstance(input, torch.Tensor) or not fast_path_allowed((m,), input):
            return class_forward(m, input)
        kind = type(m)
        if kind is nn.MaxPool2d:
            return max_pool2d(input, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices)
        if kind is nn.AvgPool2d:
            return avg_pool2d(input, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                              m.divisor_override)  # fmt: skip
        return adaptive_avg_pool2d(input, m.output_size)

    def __repr__(self) -> str:
        return f"PoolForward({type(self.module).__name__})"


_POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)


def use_ember_pools(model: nn.Module) -> int:
    """Installs :class:`PoolForward` on every ``nn.MaxPool2d``, ``nn.AvgPool2d`` and ``nn.AdaptiveAvgPool2d`` of
    ``model`` (not subclasses, whose forward may differ); returns how many."""
    return install_forwards(model, lambda m: type(m) in _POOLS, PoolForward)
