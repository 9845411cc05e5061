"""Convolutions on ember's oneDNN layer: the fast path of an inference-optimized ``nn.Conv1d/2d/3d`` or
``nn.ConvTranspose1d/2d/3d``, alone or with a BatchNorm folded in and activations or a residual add fused after
it.

Layout: 2-D and 3-D convolutions read and write channels-last activations (NHWC / NDHWC strides), which is what
oneDNN's fast implementations work on; an input in torch's default layout is converted once, at the first
convolution, and the channels-last outputs then flow from layer to layer (torch's own ops keep the layout). This
is torch's rule for a channels-last model (docs/decisions.md, "Inference"). 1-D convolutions keep their input's
layout: torch has no channels-last 3-D tensors, and code after a Conv1d often calls ``.view``.

Padding modes other than zeros are applied with torch's ``F.pad`` first, as torch does; a transposed convolution
called with ``output_size`` runs on torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd

from ember import _C
from ember._compat import conv_reversed_padding
from ember._optimize.inference.common import (
    as_kernel_dtype,
    class_forward,
    dense_strides,
    fast_path_allowed,
    in_compute_dtype,
    takes_dtype,
)
from ember._optimize.inference.state import COMPUTE_NAMES, SHARED_KERNELS, TORCH_PLAN, CallPlan, LayerState
from ember._profiling import kernel_range
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
    # A 1-D convolution reads and writes [N, C, W] channels-last (unit stride along C), where oneDNN's fast
    # implementations run (its [N, C, W] default ran Whisper's and Wav2Vec2's on its im2col GEMM, 1.3-1.9x slower):
    # set by graph mode where nothing reading the output needs torch's contiguous layout (graph/channels_last_1d.py).
    # Otherwise a 1-D convolution keeps its input's layout, as torch's Conv1d returns contiguous outputs.
    channels_last_1d: bool = False


def geometry_of(module: _ConvNd) -> Geometry | str:
    """The module's geometry, or why ember leaves it to torch."""
    spatial = module.weight.dim() - 2
    transposed = isinstance(module, TRANSPOSED)
    if transposed:
        pad = [int(p) for p in module.padding]
        right = [p - o for p, o in zip(pad, module.output_padding)]
        if min(right) < 0:
            return "output_padding exceeds padding, which oneDNN's deconvolution cannot express"
        return Geometry(list(module.stride), pad, right, list(module.dilation), module.groups, True, None)
    # torch's own record of the padding, [left, right] per dimension from the last: it resolves "same" too.
    reversed_pad = conv_reversed_padding(module)
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


def _per_dimension(value: int | Sequence[int], spatial: int) -> list[int] | None:
    values = [value] * spatial if isinstance(value, int) else list(value)
    if len(values) == 1:
        values = values * spatial
    return [int(v) for v in values] if len(values) == spatial and all(isinstance(v, int) for v in values) else None


def geometry_of_call(
    weight: torch.Tensor,
    stride: int | Sequence[int],
    padding: int | Sequence[int] | str,
    dilation: int | Sequence[int],
    groups: int,
    output_padding: int | Sequence[int] | None = None,
) -> Geometry | str:
    """The geometry of a functional convolution (``F.conv2d``, ``aten.conv2d``; transposed when ``output_padding``
    is given), or why ember leaves it to torch. ``padding="same"`` pads as torch does: the extra row of an odd total
    goes after."""
    spatial = weight.dim() - 2
    strides, dilations = _per_dimension(stride, spatial), _per_dimension(dilation, spatial)
    if strides is None or dilations is None or not isinstance(groups, int) or spatial < 1:
        return "its stride, dilation or groups are not constants"
    if output_padding is not None:
        pads, extra = _per_dimension(padding, spatial), _per_dimension(output_padding, spatial)  # type: ignore[arg-type]
        if pads is None or extra is None:
            return "its padding is not a constant"
        right = [p - o for p, o in zip(pads, extra)]
        if min(right) < 0:
            return "output_padding exceeds padding, which oneDNN's deconvolution cannot express"
        return Geometry(strides, pads, right, dilations, groups, True, None)
    if padding == "valid":
        left = right = [0] * spatial
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(dilations, weight.shape[2:])]
        left = [t // 2 for t in total]
        right = [t - t // 2 for t in total]
    else:
        pads = _per_dimension(padding, spatial)  # type: ignore[arg-type]
        if pads is None:
            return "its padding is not a constant"
        left = right = pads
    return Geometry(strides, left, right, dilations, groups, False, None)


def _layout(x: torch.Tensor, channels_last_1d: bool = False) -> torch.Tensor:
    """``x`` channels-last for 2-D and 3-D convolutions; for 1-D, channels-last where ``channels_last_1d`` (one
    channel: as it is, the two layouts being one), else unit stride along some dimension."""
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    if channels_last_1d and x.shape[1] > 1:
        return x if _is_channels_last_1d(x) else x.transpose(1, 2).contiguous().transpose(1, 2)
    return x if x.stride(-1) == 1 or x.stride(1) == 1 else x.contiguous()


def _is_channels_last_1d(x: torch.Tensor) -> bool:
    """Whether [N, C, W] ``x`` is a dense [N, W, C] seen through a transpose."""
    n, c, w = x.shape
    return x.stride(1) == 1 and (w == 1 or x.stride(2) == c) and (n == 1 or x.stride(0) == c * w)


def _out_strides(shape: list[int], x: torch.Tensor, channels_last_1d: bool = False) -> tuple[int, ...]:
    """The strides of the output for an input ``x`` as :func:`_layout` leaves it: channels-last for 2-D and 3-D
    convolutions and for 1-D ones where ``channels_last_1d``; otherwise for 1-D, [N, C, W] with unit stride along C
    when ``x`` has it (a view of a contiguous [N, W, C]) and contiguous otherwise."""
    if len(shape) > 3 or channels_last_1d or (x.stride(1) == 1 and x.stride(-1) != 1):
        return dense_strides(shape, [0, *range(2, len(shape)), 1])
    return dense_strides(shape)


def _build(
    state: LayerState, geometry: Geometry, x: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]
) -> _C.Convolution:
    """The layer's kernel, shared with every other state building it from the same tensors (SharedKernels); the
    first input's layout picks the packed weights' (any other input is served too)."""
    g = geometry
    config = ("convolution", type(state), state.compute, _hashable(astuple(g)), state.bn and state.bn.eps, x.dim())

    def build() -> _C.Convolution:
        weight, bias = state.folded_weights(tensors)
        bias = as_kernel_dtype(bias) if bias is not None else None
        return _C.Convolution(
            dlpack(as_kernel_dtype(weight)), dlpack(bias) if bias is not None else None, g.stride, g.padding_l,
            g.padding_r, g.dilation, g.groups, g.transposed, COMPUTE_NAMES[state.compute], dlpack(x),
        )  # fmt: skip

    return SHARED_KERNELS.get(config, tensors, build)


def _hashable(value: object) -> object:
    """``value`` with its lists (a geometry's) made tuples, all the way down."""
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def signature(x: torch.Tensor) -> tuple[object, ...]:
    # A 1-D convolution keeps its input's layout (_layout), so its output's strides depend on the input's.
    return (x.shape, x.dtype) if x.dim() != 3 else (x.shape, x.dtype, x.stride())


def _plan(state: LayerState, geometry: Geometry, x: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]) -> CallPlan:
    """The plan for inputs like ``x``; builds the kernel when it runs them (the output shape is the kernel's)."""
    weight = state.weight_of(tensors)
    if x.dim() != weight.dim() or x.shape[1] != (
        weight.shape[0] if geometry.transposed else weight.shape[1] * geometry.groups
    ):
        return TORCH_PLAN
    compute = state.compute
    if not takes_dtype(x.dtype, compute):
        return TORCH_PLAN
    if any(s == 0 for s in x.shape[1:]):
        return TORCH_PLAN
    convert = x.dtype != compute
    x = _prepare(x.to(compute), geometry)
    kernel = state.cache.build(lambda: _build(state, geometry, x, tensors))
    shape = kernel.output_shape(list(x.shape))
    return CallPlan(False, convert, tuple(shape), _out_strides(shape, x, geometry.channels_last_1d))


def _prepare(x: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """``x`` (in the compute dtype) padded as a padding mode other than zeros asks and in the kernel's layout."""
    if geometry.pre_pad is not None:
        x = F.pad(x, geometry.pre_pad[0], mode=geometry.pre_pad[1])
    return _layout(x, geometry.channels_last_1d)


def run(
    state: LayerState,
    geometry: Geometry,
    x: torch.Tensor,
    epilogue: Sequence[str] = (),
    operand: torch.Tensor | None = None,
    tensors: tuple[torch.Tensor | None, ...] | None = None,
) -> torch.Tensor | None:
    """``epilogue(layer(x))`` on the kernel (with ``state.bn`` folded in), ``operand`` the tensor its ``"add"`` (a
    residual) or ``"mul"`` entry reads, or None when the kernel
    does not take this call. The caller has checked :func:`fast_path_allowed`. ``tensors``: as for
    :func:`ember._optimize.inference.linear.run`.

    Runs on every call of every layer, so what depends only on the input's signature is decided once, in a plan
    (:class:`~ember._optimize.inference.state.CachedKernel`)."""
    if not x.is_cpu:
        return None
    cache = state.cache
    layer_tensors = state.tensors() if tensors is None else tensors
    plan = cache.plan(signature(x), layer_tensors, lambda: _plan(state, geometry, x, layer_tensors))
    if plan.torch:
        return None
    converted = in_compute_dtype(x, plan.convert, state.compute)
    if converted is None:
        return None
    x = _prepare(converted, geometry)
    sync_threads()  # before a build too: building packs the weight on this thread's budget
    kernel = cache.kernel
    if kernel is None:  # dropped by another thread's track() since this call's plan was made
        kernel = cache.build(lambda: _build(state, geometry, x, layer_tensors))
    out = x.new_empty_strided(plan.out_shape, plan.out_strides)
    res = None
    if operand is not None:
        if operand.shape != plan.out_shape or operand.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return None
        if torch.promote_types(x.dtype, operand.dtype) != x.dtype:
            return None  # torch's `conv(x) + residual` would be fp32: the modules run, and promote as torch does
        res = dlpack(operand)
    with kernel_range("convolution"):
        kernel.forward(dlpack(x), dlpack(out), epilogue, res)
    return out


class ConvForward:
    """The forward of an optimized convolution, installed on the instance (``module.forward``), so the module
    keeps its class, parameters and state_dict. In eval mode without autograd it runs on ember's oneDNN layer with
    the weight prepacked once; otherwise, and for a layer whose BatchNorm is folded in by its container, the
    class's own forward runs."""

    _ember_forward = True

    def __init__(self, module: _ConvNd, state: LayerState, geometry: Geometry) -> None:
        self.module = module
        self.state = state
        self.geometry = geometry

    def __call__(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:  # noqa: A002
        module = self.module
        if output_size is None and self.state.bn is None and fast_path_allowed((module,), input):
            out = run(self.state, self.geometry, input)
            if out is not None:
                return out
        if self.geometry.transposed:
            return class_forward(module, input, output_size)
        return class_forward(module, input)

    def fused(
        self, x: torch.Tensor, epilogue: Sequence[str] = (), residual: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``epilogue(layer(x) [+ residual])`` with ``state.bn`` folded in, for a container that has checked
        :func:`fast_path_allowed`; None when the kernel does not take this call."""
        return run(self.state, self.geometry, x, epilogue, residual)

    def __repr__(self) -> str:
        return f"ConvForward({type(self.module).__name__}, {self.state})"
