"""Normalization layers that take a bf16 activation beside fp32 parameters on every torch.

A bf16-optimized model runs under CPU autocast, which leaves layer_norm and group_norm to their inputs' dtypes.
torch >= 2.0 normalizes a bf16 input with fp32 weight and bias (computing in fp32, returning bf16); torch 1.13
refuses the mix ("expected scalar type BFloat16 but found Float"), so ConvNeXt's LayerNorms failed under
``ember.optimize(..., dtype=torch.bfloat16)`` there. Where the running torch refuses it, each such layer gets a
forward that normalizes the activation in fp32 and returns it in its own dtype: what newer torch computes.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ember._optimize.inference.common import class_forward, install_forwards

_NORMS = (nn.LayerNorm, nn.GroupNorm)


@functools.cache
def torch_takes_mixed_norms() -> bool:
    """Whether this torch's layer_norm and group_norm accept a bf16 input with fp32 weight and bias."""
    x = torch.zeros(1, 2, 2, dtype=torch.bfloat16)
    w, b = torch.ones(2), torch.zeros(2)
    try:
        F.layer_norm(x, (2,), w, b)
        F.group_norm(x, 1, w, b)
    except RuntimeError:
        return False
    return True


class MixedNormForward:
    """The class's forward on the activation in fp32 (the parameters' dtype), the result in the activation's dtype."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        module = self.module
        weight = module._parameters.get("weight")
        if weight is None or input.dtype == weight.dtype or not input.is_floating_point():
            return class_forward(module, input)
        return class_forward(module, input.to(weight.dtype)).to(input.dtype)

    def __repr__(self) -> str:
        return f"MixedNormForward({type(self.module).__name__})"


def let_norms_take_bf16(model: nn.Module) -> int:
    """Installs :class:`MixedNormForward` on the LayerNorm and GroupNorm modules (subclasses included, such as
    torchvision's LayerNorm2d, whose forward calls F.layer_norm) of ``model`` whose forward is not yet replaced,
    when this torch refuses a bf16 input beside fp32 parameters; returns how many."""
    if torch_takes_mixed_norms():
        return 0
    return install_forwards(model, lambda m: isinstance(m, _NORMS), MixedNormForward)
