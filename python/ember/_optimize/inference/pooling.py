"""Max pools onto ember's kernel for the module-level rewrite: an ``nn.MaxPool2d`` gets an installed forward that
runs ``ember.nn.functional.max_pool2d`` with the module's settings (its kernel for a channels-last float32 or bf16
input, torch's pool otherwise). The module keeps its class, so a graph captured from it later still sees
``nn.MaxPool2d``, and TorchScript's twin, which drops installed forwards, compiles torch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember._optimize.inference.common import class_forward, fast_path_allowed
from ember.nn.pooling import max_pool2d


class MaxPoolForward:
    """The installed forward of an ``nn.MaxPool2d`` (see the module docstring)."""

    _ember_forward = True

    def __init__(self, module: nn.MaxPool2d) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> Any:  # noqa: A002 - torch's name
        m = self.module
        if not isinstance(input, torch.Tensor) or not fast_path_allowed((m,), input):
            return class_forward(m, input)
        return max_pool2d(input, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices)

    def __repr__(self) -> str:
        return "MaxPoolForward(MaxPool2d)"


def use_ember_max_pool(model: nn.Module) -> int:
    """Installs :class:`MaxPoolForward` on every ``nn.MaxPool2d`` of ``model`` (not subclasses, whose forward may
    differ); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.MaxPool2d and "forward" not in module.__dict__:
            module.__dict__["forward"] = MaxPoolForward(module)
            count += 1
    return count
