"""Channels-last weights for convolutions: the memory layout oneDNN trains convolutions fastest in.

torch runs CPU convolutions through oneDNN. With NCHW tensors every convolution, forward and backward, reorders
its activations into oneDNN's layout and back; when the weight (or the input) is channels-last, torch asks oneDNN
for NHWC directly, and the output, and so the next layer's input, stays channels-last. On the Xeon this halves a
bf16 ResNet-50 training step (benchmarks/results/training-*.md). Only the weights' strides change: shapes, values,
``state_dict`` keys and the checkpoints' contents stay as they were (a channels-last tensor loads into a contiguous
parameter and back). The master weights' bottom halves, gradients and any optimizer state already present follow
their parameter's layout, which ember's fused kernels require of them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_LAYOUTS = {
    nn.Conv2d: torch.channels_last,
    nn.ConvTranspose2d: torch.channels_last,
    nn.Conv3d: torch.channels_last_3d,
    nn.ConvTranspose3d: torch.channels_last_3d,
}


def channels_last_by_default() -> bool:
    """Whether bf16 training makes convolution weights channels-last when the caller does not say: from torch 2.0.

    Under torch 1.13, GELU's backward after a bf16 convolution whose weight is channels-last returned NaN from finite
    values in about one call in ten (stock torch, no ember involved: Debian's torch 1.13 on an AMD Zen CPU with
    AVX512-BF16; contiguous weights, SiLU and torch 2.x gave none), which ember's split-BF16 weights would meet in
    every such model. There the layout stays as it is; ``channels_last=True`` still asks for it."""
    return int(torch.__version__.split(".")[0]) >= 2


def convolution_layout(module: nn.Module) -> torch.memory_format | None:
    """The channels-last format of ``module``'s weight, or None if it is not a 2-D or 3-D convolution."""
    return next((fmt for kind, fmt in _LAYOUTS.items() if isinstance(module, kind)), None)


@torch.no_grad()
def convert_to_channels_last(
    model: nn.Module, bottoms: dict[torch.Tensor, torch.Tensor], optimizer_state: dict[Any, dict[str, Any]]
) -> int:
    """Gives every convolution weight of ``model`` (with its bottom half, gradient and optimizer state) the
    channels-last layout; returns how many weights changed."""
    changed = 0
    for module in model.modules():
        layout = convolution_layout(module)
        p = getattr(module, "weight", None)
        if layout is None or not isinstance(p, torch.Tensor) or p.is_contiguous(memory_format=layout):
            continue
        p.data = p.data.contiguous(memory_format=layout)
        if p in bottoms:
            bottoms[p] = bottoms[p].contiguous(memory_format=layout)
        if p.grad is not None:
            p.grad = p.grad.contiguous(memory_format=layout)
        state = optimizer_state.get(p, {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                state[key] = value.contiguous(memory_format=layout)
        changed += 1
    return changed
