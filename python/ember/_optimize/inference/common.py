"""What every inference fast path shares: when it may run, how an input reaches the compute dtype, and BatchNorm
folding."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _probe_autocast_query():
    """torch >= 2.4 asks ``torch.is_autocast_enabled("cpu")`` and deprecates the older per-device function."""
    try:
        torch.is_autocast_enabled("cpu")
        return lambda: torch.is_autocast_enabled("cpu")
    except TypeError:
        return torch.is_autocast_cpu_enabled


cpu_autocast_enabled = _probe_autocast_query()


def fast_path_allowed(modules: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Eval mode, and nothing autograd would have to differentiate through."""
    if any(m.training for m in modules):
        return False
    if not torch.is_grad_enabled():
        return True
    if x.requires_grad:
        return False
    return not any(p.requires_grad for m in modules for p in m.parameters(recurse=False))


def to_compute(x: torch.Tensor, compute: torch.dtype) -> torch.Tensor | None:
    """``x`` in the layer's compute dtype, or None when the layer is torch's to run: bf16 layers take fp32 inputs
    the way autocast would; fp32 layers under a bf16 autocast, or given another dtype, are torch's to run (and to
    refuse)."""
    if not x.is_cpu:
        return None
    if x.dtype != compute:
        if compute == torch.bfloat16 and x.dtype == torch.float32:
            return x.to(compute)
        return None
    if compute == torch.float32 and cpu_autocast_enabled():
        return None
    return x


def foldable_batchnorm(bn: nn.Module, channels: int, kinds: tuple[type, ...]) -> bool:
    """A BatchNorm of one of ``kinds`` whose eval-mode output is an affine map of its input, per channel: it has
    running statistics, over ``channels`` channels."""
    return (
        isinstance(bn, kinds) and bn.track_running_stats and bn.running_mean is not None and bn.num_features == channels
    )


def fold_batchnorm(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of ``bn(layer(x))`` as one affine layer, for a layer whose output channels are the weight's
    dimension 0 (Linear, Conv); computed in float64 and returned in float32."""
    var = bn.running_var.double()
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    w = weight.double() * scale.reshape(-1, *([1] * (weight.dim() - 1)))
    b = shift if bias is None else bias.double() * scale + shift
    return w.float(), b.float()


def batchnorm_tensors(bn: nn.Module | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors a folded layer's kernel is built from, besides the layer's own."""
    if bn is None:
        return ()
    return (bn.weight, bn.bias, bn.running_mean, bn.running_var)


def as_kernel_dtype(t: torch.Tensor) -> torch.Tensor:
    """A weight or bias as the kernels take it: float32 or bfloat16 (float64 or float16 parameters in float32)."""
    return t if t.dtype in (torch.float32, torch.bfloat16) else t.float()
