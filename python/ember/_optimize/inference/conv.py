"""Convolutions on ember's oneDNN layer: the fast path of an inference-optimized ``nn.Conv1d/2d/3d`` or
``nn.ConvTranspose1d/2d/3d``, alone or with a BatchNorm folded in and activations or a residual add fused after
it.

Layout: 2-D and 3-D convolutions read and write channels-last activations (NHWC / NDHWC strides), which is what
oneDNN's fast implementations work on; an input in torch's default layout is converted once, at the first
convolution, and the channels-last outputs then flow from layer to layer (torch's own ops keep the layout). This
is torch's rule for a channels-last model (docs/DESIGN.md, "Inference"). 1-D convolutions keep their input's
layout: torch has no channels-last 3-D tensors, and code after a Conv1d often calls ``.view``.

Padding modes other than zeros are applied with torch's ``F.pad`` first, as torch does; a transposed convolution
called with ``output_size`` runs on torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._optimize.inference.common import (
    as_kernel_dtype,
    batchnorm_tensors,
    fast_path_allowed,
    fold_batchnorm,
    to_compute,
)
from ember._optimize.inference.state import COMPUTE_NAMES, LayerState
from ember._tensor import dlpack, sync_threads

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
# The BatchNorm that may follow each convolution (torch checks the input's rank; a fold must not skip that check).
BATCHNORM_OF = {nn.Conv1d: nn.BatchNorm1d, nn.Conv2d: nn.BatchNorm2d, nn.Conv3d: nn.BatchNorm3d}


@dataclass(frozen=True)
class Geometry:
    """A convolution module's arguments as ember's layer takes them."""

    stride: list[int]
    padding_l: list[int]
    padding_r: list[int]
    dilation: list[int]
    groups: int
    transposed: bool
    pre_pad: tuple[list[int], str] | None  # (torch's F.pad amounts, mode) applied before a zero-padded layer


def geometry_of(module: nn.Module) -> Geometry | str:
    """The module's geometry, or why ember leaves it to torch."""
    spatial = module.weight.dim() - 2
    transposed = isinstance(module, TRANSPOSED)
    if transposed:
        pad = list(module.padding)
        right = [p - o for p, o in zip(pad, module.output_padding)]
        if min(right) < 0:
            return "output_padding exceeds padding, which oneDNN's deconvolution cannot express"
        return Geometry(list(module.stride), pad, right, list(module.dilation), module.groups, True, None)
    # torch's own record of the padding, [left, right] per dimension from the last: it resolves "same" too.
    reversed_pad = list(module._reversed_padding_repeated_twice)
    left = [reversed_pad[2 * (spatial - 1 - d)] for d in range(spatial)]
    right = [reversed_pad[2 * (spatial - 1 - d) + 1] for d in range(spatial)]
    if module.padding_mode != "zeros":
        zeros = [0] * spatial
        return Geometry(
            list(module.stride),
            zeros,
            zeros,
            list(module.dilation),
            module.groups,
            False,
            (reversed_pad, module.padding_mode),
        )
    return Geometry(list(module.stride), left, right, list(module.dilation), module.groups, False, None)


def _layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` channels-last for 2-D and 3-D convolutions; for 1-D, unit stride along some dimension."""
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    return x if x.stride(-1) == 1 or x.stride(1) == 1 else x.contiguous()


def _empty_like_layout(shape: list[int], x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.dim() == 4:
        return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
    if x.dim() == 5:
        return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last_3d)
    if x.stride(1) == 1 and x.stride(-1) != 1:  # a [N, C, W] view of a contiguous [N, W, C]: keep it
        return torch.empty((shape[0], shape[2], shape[1]), dtype=dtype).transpose(1, 2)
    return torch.empty(shape, dtype=dtype)


def _build(module: nn.Module, state: LayerState, geometry: Geometry, x: torch.Tensor) -> _C.Convolution:
    weight = module.weight.detach()
    bias = module.bias.detach() if module.bias is not None else None
    if state.bn is not None:
        weight, bias = fold_batchnorm(weight, bias, state.bn)
    bias = as_kernel_dtype(bias) if bias is not None else None
    g = geometry
    return _C.Convolution(
        dlpack(as_kernel_dtype(weight)),
        dlpack(bias) if bias is not None else None,
        g.stride,
        g.padding_l,
        g.padding_r,
        g.dilation,
        g.groups,
        g.transposed,
        COMPUTE_NAMES[state.compute],
        dlpack(x),
    )


def kernel_of(module: nn.Module, state: LayerState, geometry: Geometry, x: torch.Tensor) -> _C.Convolution:
    """The module's oneDNN layer, built (or rebuilt, after its weights changed) on demand; the first input it sees
    picks the layout the weights are packed for."""
    tensors = (module.weight, module.bias, *batchnorm_tensors(state.bn))
    return state.cache.get(tensors, lambda: _build(module, state, geometry, x))


def run(
    module: nn.Module,
    state: LayerState,
    geometry: Geometry,
    x: torch.Tensor,
    epilogue: Sequence[str] = (),
    residual: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``epilogue(module(x) [+ residual])`` on the kernel (with ``state.bn`` folded in), or None when the kernel
    does not take this call. The caller has checked :func:`fast_path_allowed`."""
    weight = module.weight
    if x.dim() != weight.dim() or x.shape[1] != (
        weight.shape[0] if geometry.transposed else weight.shape[1] * module.groups
    ):
        return None
    x = to_compute(x, state.compute)
    if x is None or any(s == 0 for s in x.shape[1:]):
        return None
    if geometry.pre_pad is not None:
        x = F.pad(x, geometry.pre_pad[0], mode=geometry.pre_pad[1])
    x = _layout(x)
    kernel = kernel_of(module, state, geometry, x)
    shape = kernel.output_shape(list(x.shape))
    out = _empty_like_layout(shape, x, state.compute)
    res = None
    if residual is not None:
        if list(residual.shape) != shape or residual.dtype not in (torch.float32, torch.bfloat16):
            return None
        res = dlpack(residual)
    sync_threads()
    kernel.forward(dlpack(x), dlpack(out), list(epilogue), res)
    return out


class ConvForward:
    """The forward of an optimized convolution, installed on the instance (``module.forward``), so the module
    keeps its class, parameters and state_dict. In eval mode without autograd it runs on ember's oneDNN layer with
    the weight prepacked once; otherwise, and for a layer whose BatchNorm is folded in by its container, the
    class's own forward runs."""

    _ember_forward = True

    def __init__(self, module: nn.Module, state: LayerState, geometry: Geometry) -> None:
        self.module = module
        self.state = state
        self.geometry = geometry

    def __call__(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:  # noqa: A002
        module = self.module
        if output_size is None and self.state.bn is None and fast_path_allowed((module,), input):
            out = run(module, self.state, self.geometry, input)
            if out is not None:
                return out
        if self.geometry.transposed:
            return type(module).forward(module, input, output_size)
        return type(module).forward(module, input)

    def fused(
        self, x: torch.Tensor, epilogue: Sequence[str] = (), residual: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``epilogue(layer(x) [+ residual])`` with ``state.bn`` folded in, for a container that has checked
        :func:`fast_path_allowed`; None when the kernel does not take this call."""
        return run(self.module, self.state, self.geometry, x, epilogue, residual)

    def __repr__(self) -> str:
        return f"ConvForward({type(self.module).__name__}, {self.state})"
