"""Linear layers on ember's oneDNN matmul: the fast path of an inference-optimized ``nn.Linear`` (or Hugging Face
``Conv1D``), alone or with a BatchNorm1d folded in and activations or a residual add fused after it.

A weight already in the compute dtype is read where it is, so no second copy of it exists; other weights (fp32
ones computing in bf16, BatchNorm-folded ones) are packed once into oneDNN's blocked layout (:func:`runs_in_place`).

The decision to take the fast path is made per call and is always safe: in train mode, when autograd would need
this layer's graph, for dtypes or devices the kernel does not take, or for the shapes where torch's own kernel is
the faster one, the original modules run as they are (so an optimized model put back into training computes the
exact gradients of the original).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._optimize.inference.common import (
    as_kernel_dtype,
    dense_strides,
    fast_path_allowed,
    fold_batchnorm,
    in_compute_dtype,
    parameter,
    takes_dtype,
)
from ember._optimize.inference.state import COMPUTE_NAMES, TORCH_PLAN, CallPlan, LayerState
from ember._profiling import kernel_range
from ember._tensor import dlpack, sync_threads

# The fp32 rules below were measured on the Xeon and hold only where torch's fp32 matmul is MKL's on an Intel CPU
# (:func:`torch_fp32_matmul_is_mkl_on_intel`). There torch's kernel is faster for fp32 at these shapes
# (benchmarks/results/linear-intel-*.md: oneDNN's fp32 matmul reads a single row no faster than torch, and below
# ~4M weights at 8 rows or fewer its per-call cost shows, more so on the weight in place, where it reorders slices
# of it on every call).
_FP32_TORCH_ROWS = 1
_FP32_SMALL_ROWS = 8
_FP32_SMALL_WEIGHT = 4 * 2**20
# oneDNN on a K-major weight in place (Hugging Face's Conv1D) lost to torch at up to 8 rows (0.8-0.96x in bf16,
# 0.3-0.66x in fp32 on the Xeon; in bf16 also on the Zen 5 VM at 4096x4096, 0.7x); the skinny matmul does not take
# it (its dot products run along rows of w).
_K_MAJOR_TORCH_ROWS = 8
# Row counts at which torch's fp32 kernel matched or beat the skinny matmul on weights under 4M (BERT-base's) in
# two runs on the Xeon (0.88-0.94x at 2 rows, 0.89-1.04x at 8); 3 rows are taken as 4 are. Under 1M elements
# (768x768) torch's kernel was as fast at every row count up to 8, and the module call around ember's kernel,
# a few microseconds more than nn.Linear's, then made it 0.87-0.92x the stock module at 1 row and 0.9-1.01x at 4.
_FP32_SMALL_TORCH_ROWS = frozenset({2, 5, 6, 7, 8})
_FP32_TINY_WEIGHT = 2**20
# oneDNN's bf16 matmul on an unpacked weight copies slices of it into the AMX layout on every call: from ~32M
# weights (64 MiB, more than the Xeon's caches) that costs what it saves (0.79-1.14x torch at 11008x4096 from 32
# rows, over two runs), and torch's kernel runs instead. (Up to 32 rows such weights run on the skinny matmul's AMX
# path, 2.1-2.4x torch at 16-32 rows.)
_BF16_IN_PLACE_TORCH_WEIGHT = 32 * 2**20


@functools.cache
def torch_fp32_matmul_is_mkl_on_intel() -> bool:
    """Whether torch's fp32 matmul is MKL's on an Intel CPU, where MKL takes its fast small-matrix kernels. On other
    CPUs it does not (on the Zen 5 VM torch's fp32 kernel at 2-8 rows ran 2-7x slower than ember's: 768x768 at 2
    rows 66 µs against 17), and a torch built on another BLAS (Debian's torch 1.13) was not measured to win; there
    ember's kernels take every fp32 call they can."""
    return torch.backends.mkl.is_available() and _C.cpu_features()["vendor"] == "GenuineIntel"


def weight_of(module: nn.Module) -> torch.Tensor:
    """The [out_features, in_features] weight of an nn.Linear, or a transposed view of a Conv1D's [in, out] one."""
    return module.weight if isinstance(module, nn.Linear) else module.weight.t()


def prefers_torch(compute: torch.dtype, rows: int, weight: torch.Tensor, in_place: bool) -> bool:
    """Whether torch's kernel is the faster one for this call, given the [N, K] ``weight``. A few rows on a weight
    in place run on ember's skinny matmul (csrc/skinny/), which streams the weight as fast as torch's does or
    faster, when its rows are contiguous; a K-major one (Hugging Face's Conv1D) would go to oneDNN, which reorders
    it on every call and loses to torch at few rows."""
    fp32_torch_fast = compute == torch.float32 and torch_fp32_matmul_is_mkl_on_intel()
    if in_place and weight.stride(1) != 1:
        if rows <= _K_MAJOR_TORCH_ROWS and (compute == torch.bfloat16 or fp32_torch_fast):
            return True
    elif in_place and rows <= _C.Linear.skinny_rows(COMPUTE_NAMES[compute]):
        size = weight.numel()
        return fp32_torch_fast and (
            size < _FP32_TINY_WEIGHT or (size < _FP32_SMALL_WEIGHT and rows in _FP32_SMALL_TORCH_ROWS)
        )
    if compute == torch.bfloat16:
        return in_place and weight.numel() >= _BF16_IN_PLACE_TORCH_WEIGHT
    return fp32_torch_fast and (
        rows <= _FP32_TORCH_ROWS or (rows <= _FP32_SMALL_ROWS and weight.numel() < _FP32_SMALL_WEIGHT)
    )


def runs_in_place(module: nn.Module, state: LayerState) -> bool:
    """Whether the kernel reads the module's own weight rather than a packed copy: when the weight is already in the
    compute dtype and nothing is folded into it, unless the user asked for packed copies (``weights_prepack=True``).
    A copy would hold the same numbers a second time, doubling the layer's memory (an fp32 model computing in fp32,
    a bf16 model in bf16), for a speed-up in fp32 from a few rows (1.2-2.9x torch against 0.9-2.2x in place,
    benchmarks/results/linear-*.md). With a BatchNorm folded in, or another compute dtype, the weights oneDNN reads
    are new numbers and are packed as they are made."""
    return not state.pack and state.bn is None and module.weight.dtype == state.compute


def _build(module: nn.Module, state: LayerState) -> _C.Linear:
    weight = weight_of(module).detach()
    bias = module.bias.detach() if module.bias is not None else None
    if state.bn is not None:
        weight, bias = fold_batchnorm(weight, bias, state.bn)
    bias = as_kernel_dtype(bias) if bias is not None else None
    return _C.Linear(
        dlpack(as_kernel_dtype(weight)),
        dlpack(bias) if bias is not None else None,
        COMPUTE_NAMES[state.compute],
        not runs_in_place(module, state),
    )


def _signature(x: torch.Tensor) -> tuple:
    return (x.shape, x.dtype)


def _plan(module: nn.Module, state: LayerState, x: torch.Tensor) -> CallPlan:
    """The plan for inputs like ``x``: torch's kernel where it is the faster one (:func:`prefers_torch`), else
    ember's, writing a contiguous output of x's leading dimensions."""
    compute = state.compute
    weight = weight_of(module)
    n, k = weight.shape
    if x.shape[-1] != k or (state.bn is not None and x.dim() != 2):
        return TORCH_PLAN  # (BatchNorm1d reads a 3-D input's channels from dimension 1, which this fold does not)
    if not takes_dtype(x.dtype, compute):
        return TORCH_PLAN
    in_place = runs_in_place(module, state)
    if prefers_torch(compute, x.numel() // k, weight, in_place):
        return TORCH_PLAN
    shape = (*x.shape[:-1], n)
    return CallPlan(False, x.dtype != compute, shape, dense_strides(shape), in_place)


def _rows_apart(t: torch.Tensor) -> bool:
    """Whether the kernel reads a non-contiguous [M, K] ``t`` where it lies: unit stride along K and rows that do not
    overlap. An expanded (zero-stride) or overlapping view is copied first."""
    return t.dim() == 2 and t.stride(1) == 1 and (t.shape[0] <= 1 or t.stride(0) >= t.shape[1])


def run(
    module: nn.Module,
    state: LayerState,
    x: torch.Tensor,
    epilogue: Sequence[str] = (),
    residual: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``epilogue(module(x) [+ residual])`` on the kernel (with ``state.bn`` folded in), or None when the kernel
    does not take this call (the caller then runs the modules). The caller has checked :func:`fast_path_allowed`.

    Runs on every call of every layer, so what depends only on the input's shape and dtype is decided once, in a
    plan (:class:`~ember._optimize.inference.state.CachedKernel`)."""
    if x.dim() < 2:
        if x.dim() == 0 or state.bn is not None:  # (torch's BatchNorm1d refuses a 1-D input)
            return None
        out = run(module, state, x.unsqueeze(0), epilogue, None if residual is None else residual.unsqueeze(0))
        return None if out is None else out.squeeze(0)
    if not x.is_cpu:
        return None
    cache = state.cache
    tensors = state.tensors(module)
    plan = cache.plan(_signature(x), tensors, lambda: _plan(module, state, x))
    if plan.torch:
        return None
    x = in_compute_dtype(x, plan.convert, state.compute)
    if x is None:
        return None
    # The binding reads a [..., K] tensor's rows where they lie (_C.Linear.forward), so a contiguous input, the
    # usual case, is passed as it is and the output made in its final shape: no reshape on either side.
    if not x.is_contiguous() and not _rows_apart(x):
        x = x.contiguous()
    sync_threads()  # before a build too: building packs the weight on this thread's budget
    kernel = cache.kernel
    if kernel is None:
        kernel = cache.build(lambda: _build(module, state))
    res = None
    out_dtype = x.dtype
    if residual is not None:
        if residual.shape != plan.out_shape or residual.dtype not in (torch.float32, torch.bfloat16):
            return None
        if not residual.is_contiguous() and not _rows_apart(residual):
            residual = residual.contiguous()
        res = dlpack(residual)
        # torch's `layer(x) + residual` promotes: a bf16 layer output added to an fp32 residual stream (autocast
        # keeps one in fp32) is fp32, and the kernel adds in fp32 and stores fp32 as well.
        out_dtype = torch.promote_types(x.dtype, residual.dtype)
    out = x.new_empty_strided(plan.out_shape, plan.out_strides, dtype=out_dtype)
    weight_arg = None
    if plan.in_place:  # to_dlpack takes a parameter as it is (_tensor.py); a Conv1D's [K, N] weight is read as [N, K]
        weight_arg = dlpack(tensors[0] if isinstance(module, nn.Linear) else tensors[0].t())
    with kernel_range("linear"):
        kernel.forward(dlpack(x), weight_arg, dlpack(out), epilogue, res)
    return out


class LinearForward:
    """The forward of an optimized ``nn.Linear`` or ``Conv1D``, installed on the instance (``module.forward``), so
    the module keeps its class, parameters and state_dict. In eval mode without autograd it runs on ember's oneDNN
    matmul (on the weight where it is, or on a copy packed once: :func:`runs_in_place`); otherwise, and for a
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
            plan = self.state.cache.plans.get(_signature(input))
            if plan is not None and plan.torch:
                return F.linear(input, parameter(module, "weight"), parameter(module, "bias"))
        if self.state.bn is None and fast_path_allowed((module,), input):
            out = run(module, self.state, input)
            if out is not None:
                return out
        return type(module).forward(module, input)

    def fused(
        self, x: torch.Tensor, epilogue: Sequence[str] = (), residual: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """``epilogue(layer(x) [+ residual])`` with ``state.bn`` folded in, for a container that has checked
        :func:`fast_path_allowed`; None when the kernel does not take this call."""
        return run(self.module, self.state, x, epilogue, residual)

    def __repr__(self) -> str:
        return f"LinearForward({type(self.module).__name__}, {self.state})"
