"""Linear layers on ember's matmul kernels: the fast path of an inference-optimized ``nn.Linear`` (or Hugging Face
``Conv1D``), alone or with a BatchNorm1d folded in and activations and a residual add (or a multiplication by a
tensor) fused after it. Which kernel serves a call (ember's skinny matmul, oneDNN's, or torch's own) is the C++
router's answer (``_C.Linear.route``, csrc/linear/), asked once per input shape.

A weight already in the compute dtype is read where it is, so no second copy of it exists; other weights (fp32
ones computing in bf16, BatchNorm-folded ones) are packed once into oneDNN's blocked layout (:func:`runs_in_place`).

The decision to take the fast path is made per call and is always safe: in train mode, when autograd would need
this layer's graph, for dtypes or devices the kernel does not take, or for the shapes where torch's own kernel is
the faster one, the original modules run as they are (so an optimized model put back into training computes the
exact gradients of the original).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._optimize.inference.common import (
    as_kernel_dtype,
    class_forward,
    dense_strides,
    fast_path_allowed,
    in_compute_dtype,
    parameter,
    takes_dtype,
)
from ember._optimize.inference.state import COMPUTE_NAMES, SHARED_KERNELS, TORCH_PLAN, CallPlan, LayerState
from ember._profiling import kernel_range
from ember._tensor import dlpack, sync_threads, torch_fp32_matmul_is_mkl_on_intel


def layer_state(module: nn.Module, compute: torch.dtype, pack: bool = False) -> LayerState:
    """The state of an ``nn.Linear`` (weight [out, in]) or a Hugging Face ``Conv1D`` (weight [in, out], read
    transposed)."""
    return LayerState.of_module(module, compute, transposed=not isinstance(module, nn.Linear), pack=pack)


def runs_in_place(state: LayerState, weight: torch.Tensor | None = None) -> bool:
    """Whether the kernel reads the module's own weight rather than a packed copy: when the weight is already in the
    compute dtype and nothing is folded into it, unless the user asked for packed copies (``weights_prepack=True``).
    A copy would hold the same numbers a second time, doubling the layer's memory (an fp32 model computing in fp32,
    a bf16 model in bf16), for a speed-up in fp32 from a few rows (1.2-2.9x torch against 0.9-2.2x in place,
    benchmarks/results/linear-*.md). With a BatchNorm or a scale folded in, or another compute dtype, the weights
    oneDNN reads are new numbers and are packed as they are made. float16 layers always pack: the kernels read f32
    or bf16 weights in place only."""
    dtype = (weight if weight is not None else state.weight()).dtype
    return not state.pack and not state.folds and dtype == state.compute != torch.float16


def _build(state: LayerState, tensors: tuple[torch.Tensor | None, ...]) -> _C.Linear:
    """The layer's kernel, shared with every other state building it from the same tensors (SharedKernels)."""
    in_place = runs_in_place(state, state.weight_like(tensors))
    config = ("linear", type(state), state.compute, state.transposed, in_place, state.bn and state.bn.eps)

    def build() -> _C.Linear:
        weight, bias = state.folded_weights(tensors)
        bias = as_kernel_dtype(bias) if bias is not None else None
        return _C.Linear(
            dlpack(as_kernel_dtype(weight)), dlpack(bias) if bias is not None else None, COMPUTE_NAMES[state.compute],
            not in_place,
        )  # fmt: skip

    return SHARED_KERNELS.get(config, tensors, build)


def signature(x: torch.Tensor) -> tuple[torch.Size, torch.dtype]:
    return (x.shape, x.dtype)


def _plan(state: LayerState, x: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]) -> CallPlan:
    """The plan for inputs like ``x``: torch's kernel where the router says it is the faster one, else ember's,
    writing a contiguous output of x's leading dimensions."""
    compute = state.compute
    weight = state.weight_like(tensors)
    n, k = weight.shape
    if x.shape[-1] != k or (state.bn is not None and x.dim() != 2):
        return TORCH_PLAN  # (BatchNorm1d reads a 3-D input's channels from dimension 1, which this fold does not)
    if not takes_dtype(x.dtype, compute):
        return TORCH_PLAN
    in_place = runs_in_place(state, weight)
    if n == 0 or k == 0 or x.numel() == 0:
        return TORCH_PLAN  # nothing to compute, or nothing to multiply: torch's zeros and bias, as it gives them
    rows = x.numel() // k
    # The router (csrc/linear/) knows every Linear kernel, torch's among them: this is the one question asked of it.
    mkl = torch_fp32_matmul_is_mkl_on_intel()
    if _C.Linear.route(COMPUTE_NAMES[compute], rows, dlpack(weight.detach()), in_place, mkl) == "caller":
        return TORCH_PLAN
    shape = (*x.shape[:-1], n)
    return CallPlan(False, x.dtype != compute, shape, dense_strides(shape), in_place)


def rows_apart(t: torch.Tensor) -> bool:
    """Whether the kernel reads a non-contiguous [M, K] ``t`` where it lies: unit stride along K and rows that do not
    overlap. An expanded (zero-stride) or overlapping view is copied first."""
    return t.dim() == 2 and t.stride(1) == 1 and (t.shape[0] <= 1 or t.stride(0) >= t.shape[1])


def run(
    state: LayerState,
    x: torch.Tensor,
    epilogue: Sequence[str] = (),
    operand: torch.Tensor | None = None,
    tensors: tuple[torch.Tensor | None, ...] | None = None,
) -> torch.Tensor | None:
    """``epilogue(layer(x))`` on the kernel (with ``state.bn`` folded in), or None when the kernel does not take this
    call (the caller then runs the modules). ``operand`` is the tensor the epilogue's ``"add"`` (a residual) or
    ``"mul"`` entry reads, of the output's shape. The caller has checked :func:`fast_path_allowed`.
    ``tensors``: the layer's tensors in :meth:`LayerState.tensors`' order when the caller holds them (a graph that
    passes its weights as inputs); by default the state reads them where they live.

    Runs on every call of every layer, so what depends only on the input's shape and dtype is decided once, in a
    plan (:class:`~ember._optimize.inference.state.CachedKernel`)."""
    if x.dim() < 2:
        if x.dim() == 0 or state.bn is not None:  # (torch's BatchNorm1d refuses a 1-D input)
            return None
        out = run(state, x.unsqueeze(0), epilogue, None if operand is None else operand.unsqueeze(0), tensors)
        return None if out is None else out.squeeze(0)
    if not x.is_cpu:
        return None
    cache = state.cache
    layer_tensors = state.tensors() if tensors is None else tensors
    plan = cache.plan(signature(x), layer_tensors, lambda: _plan(state, x, layer_tensors))
    if plan.torch:
        return None
    converted = in_compute_dtype(x, plan.convert, state.compute)
    if converted is None:
        return None
    x = converted
    # The binding reads a [..., K] tensor's rows where they lie (_C.Linear.forward), so a contiguous input, the
    # usual case, is passed as it is and the output made in its final shape: no reshape on either side.
    if not x.is_contiguous() and not rows_apart(x):
        x = x.contiguous()
    sync_threads()  # before a build too: building packs the weight on this thread's budget
    kernel = cache.kernel
    if kernel is None:
        kernel = cache.build(lambda: _build(state, layer_tensors))
    res = None
    out_dtype = x.dtype
    scale = state.scale_of(layer_tensors)
    if scale is not None:  # torch's `layer(x) * scale`: an fp32 scale makes a bf16 result fp32
        out_dtype = torch.promote_types(out_dtype, scale.dtype)
    if operand is not None:
        if operand.shape != plan.out_shape or operand.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return None
        if not operand.is_contiguous() and not rows_apart(operand):
            operand = operand.contiguous()
        res = dlpack(operand)
        # torch's `layer(x) + residual` promotes (and `* factor` alike): a bf16 layer output added to an fp32
        # residual stream (autocast keeps one in fp32) is fp32, and the kernel adds in fp32 and stores fp32 as well.
        out_dtype = torch.promote_types(out_dtype, operand.dtype)
    out = x.new_empty_strided(plan.out_shape, plan.out_strides, dtype=out_dtype)
    weight_arg = None
    if plan.in_place:  # to_dlpack takes a parameter as it is (_tensor.py); a Conv1D's [K, N] weight is read as [N, K]
        weight = cast(torch.Tensor, layer_tensors[0])  # the plan was made for these tensors: the weight is there
        weight_arg = dlpack(weight.t() if state.transposed else weight)
    with kernel_range("linear"):
        kernel.forward(dlpack(x), weight_arg, dlpack(out), epilogue, res)
    return out


class LinearForward:
    """The forward of an optimized ``nn.Linear`` or ``Conv1D``, installed on the instance (``module.forward``), so
    the module keeps its class, parameters and state_dict. In eval mode without autograd it runs on ember's oneDNN
    kernels (on the weight where it is, or on a copy packed once: :func:`runs_in_place`); otherwise, and for a
    layer whose BatchNorm is folded in by its container, the class's own forward runs."""

    _ember_forward = True

    def __init__(self, module: nn.Module, state: LayerState) -> None:
        self.module = module
        self.state = state
        self.plain = type(module) is nn.Linear

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        module = self.module
        if self.plain:
            # Where the plan leaves inputs like this one to torch, run nn.Linear.forward's F.linear at once: the
            # shapes torch's kernel wins are small and fast, and checks there made ember slower than the stock
            # module (0.92-0.96x at 2-8 rows of BERT-sized fp32 weights on the Xeon).
            plan = self.state.cache.plans.get(signature(input))
            if plan is not None and plan.torch:
                return F.linear(input, cast(torch.Tensor, parameter(module, "weight")), parameter(module, "bias"))
        if self.state.bn is None and fast_path_allowed((module,), input):
            out = run(self.state, input)
            if out is not None:
                return out
        return class_forward(module, input)

    def fused(
        self, x: torch.Tensor, epilogue: Sequence[str] = (), residual: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``epilogue(layer(x) [+ residual])`` with ``state.bn`` folded in, for a container that has checked
        :func:`fast_path_allowed`; None when the kernel does not take this call."""
        return run(self.state, x, epilogue, residual)

    def __repr__(self) -> str:
        return f"LinearForward({type(self.module).__name__}, {self.state})"
