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

from collections.abc import Sequence

import torch
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

# torch's kernel is faster for fp32 at these shapes (benchmarks/results/linear-*.md: oneDNN's fp32 matmul reads a
# single row no faster than torch, and below ~4M weights at 8 rows or fewer its per-call cost shows, more so on
# the weight in place, where it reorders slices of it on every call).
_FP32_TORCH_ROWS = 1
_FP32_SMALL_ROWS = 8
_FP32_SMALL_WEIGHT = 4 * 2**20
# oneDNN on a K-major weight in place (Hugging Face's Conv1D) lost to torch at up to 8 rows (0.8-0.96x in bf16,
# 0.3-0.66x in fp32 on the Xeon); the skinny matmul does not take it (its dot products run along rows of w).
_K_MAJOR_TORCH_ROWS = 8
# Row counts at which torch's fp32 kernel matched or beat the skinny matmul on weights under 4M (BERT-base's) in
# two runs on the Xeon (0.88-0.94x at 2 rows, 0.89-1.04x at 8); 3 rows are taken as 4 are.
_FP32_SMALL_TORCH_ROWS = frozenset({2, 5, 6, 7, 8})
# oneDNN's bf16 matmul on an unpacked weight copies slices of it into the AMX layout on every call: from ~32M
# weights (64 MiB, more than the Xeon's caches) that costs what it saves (0.79-1.14x torch at 11008x4096 from 32
# rows, over two runs), and torch's kernel runs instead.
_BF16_IN_PLACE_TORCH_WEIGHT = 32 * 2**20


def weight_of(module: nn.Module) -> torch.Tensor:
    """The [out_features, in_features] weight of an nn.Linear, or a transposed view of a Conv1D's [in, out] one."""
    return module.weight if isinstance(module, nn.Linear) else module.weight.t()


def prefers_torch(compute: torch.dtype, rows: int, weight: torch.Tensor, in_place: bool) -> bool:
    """Whether torch's kernel is the faster one for this call, given the [N, K] ``weight``. A few rows on a weight
    in place run on ember's skinny matmul (csrc/skinny/), which streams the weight as fast as torch's does or
    faster, when its rows are contiguous; a K-major one (Hugging Face's Conv1D) would go to oneDNN, which reorders
    it on every call and loses to torch at few rows."""
    if in_place and weight.stride(1) != 1:
        if rows <= _K_MAJOR_TORCH_ROWS:
            return True
    elif in_place and rows <= _C.Linear.skinny_rows(COMPUTE_NAMES[compute]):
        return compute == torch.float32 and weight.numel() < _FP32_SMALL_WEIGHT and rows in _FP32_SMALL_TORCH_ROWS
    if compute == torch.bfloat16:
        return in_place and weight.numel() >= _BF16_IN_PLACE_TORCH_WEIGHT
    return rows <= _FP32_TORCH_ROWS or (rows <= _FP32_SMALL_ROWS and weight.numel() < _FP32_SMALL_WEIGHT)


def runs_in_place(module: nn.Module, state: LayerState) -> bool:
    """Whether the kernel reads the module's own weight rather than a packed copy: when the weight is already in the
    compute dtype and nothing is folded into it, unless the user asked for packed copies (``weights_prepack=True``).
    A copy would hold the same numbers a second time, doubling the layer's memory (an fp32 model computing in fp32,
    a bf16 model in bf16), for a speed-up in fp32 from a few rows (1.2-2.9x torch against 0.9-2.2x in place,
    benchmarks/results/linear-*.md). With a BatchNorm folded in, or another compute dtype, the weights oneDNN reads
    are new numbers and are packed as they are made."""
    return _reads_in_place(state, module.weight)


def _reads_in_place(state: LayerState, weight: torch.Tensor) -> bool:
    return not state.pack and state.bn is None and weight.dtype == state.compute


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


def _tensors_of(module: nn.Module, state: LayerState) -> tuple[torch.Tensor | None, ...]:
    return (module.weight, module.bias, *batchnorm_tensors(state.bn))


def kernel_of(module: nn.Module, state: LayerState) -> _C.Linear:
    """The module's oneDNN layer, built (or rebuilt, after its weights changed) on demand."""
    return state.cache.get(_tensors_of(module, state), lambda: _build(module, state))


def run(
    module: nn.Module,
    state: LayerState,
    x: torch.Tensor,
    epilogue: Sequence[str] = (),
    residual: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``epilogue(module(x) [+ residual])`` on the kernel (with ``state.bn`` folded in), or None when the kernel
    does not take this call (the caller then runs the modules). The caller has checked :func:`fast_path_allowed`."""
    compute = state.compute
    weight = weight_of(module)
    dim = x.dim()
    if dim == 0 or x.shape[-1] != weight.shape[1] or (state.bn is not None and dim != 2):
        return None  # (BatchNorm1d reads a 3-D input's channels from dimension 1, which this fold does not)
    x = to_compute(x, compute)
    if x is None:
        return None
    # The binding reads a [..., K] tensor's rows where they lie (_C.Linear.forward), so a contiguous input, the
    # usual case, is passed as it is and the output made in its final shape: no reshape on either side.
    if dim == 1:
        out = run(module, state, x.unsqueeze(0), epilogue, None if residual is None else residual.unsqueeze(0))
        return None if out is None else out.squeeze(0)
    if x.stride(-1) != 1 or (dim > 2 and not x.is_contiguous()):
        x = x.contiguous()
    k = weight.shape[1]
    rows = x.numel() // k
    if prefers_torch(compute, rows, weight, _reads_in_place(state, weight)):
        return None
    kernel = kernel_of(module, state)
    weight_arg = None if kernel.prepack else dlpack(weight)  # to_dlpack takes a parameter as it is (_tensor.py)
    out = torch.empty((*x.shape[:-1], kernel.out_features), dtype=compute)
    res = None
    if residual is not None:
        if residual.shape != out.shape or residual.dtype not in (torch.float32, torch.bfloat16):
            return None
        if residual.stride(-1) != 1 or (dim > 2 and not residual.is_contiguous()):
            residual = residual.contiguous()
        res = dlpack(residual)
    sync_threads()
    kernel.forward(dlpack(x), weight_arg, dlpack(out), list(epilogue), res)
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

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        module = self.module
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
