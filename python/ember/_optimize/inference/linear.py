"""Linear layers on ember's oneDNN matmul: the fast path of an inference-optimized ``nn.Linear`` (or Hugging Face
``Conv1D``), alone or with a BatchNorm1d folded in and activations or a residual add fused after it.

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
from ember._optimize.inference.state import COMPUTE_NAMES, LayerState
from ember._tensor import dlpack, sync_threads

# torch's kernel is faster for fp32 at these shapes (benchmarks/results/linear-*.md: oneDNN's fp32 matmul reads a
# single row no faster than torch, and its per-call cost shows below ~4M weights at 8 rows or fewer).
_FP32_TORCH_ROWS = 1
_FP32_SMALL_ROWS = 8
_FP32_SMALL_WEIGHT = 4 * 2**20


def _probe_autocast_query():
    """torch >= 2.4 asks ``torch.is_autocast_enabled("cpu")`` and deprecates the older per-device function."""
    try:
        torch.is_autocast_enabled("cpu")
        return lambda: torch.is_autocast_enabled("cpu")
    except TypeError:
        return torch.is_autocast_cpu_enabled


cpu_autocast_enabled = _probe_autocast_query()


def weight_of(module: nn.Module) -> torch.Tensor:
    """The [out_features, in_features] weight of an nn.Linear, or a transposed view of a Conv1D's [in, out] one."""
    return module.weight if isinstance(module, nn.Linear) else module.weight.t()


def prefers_torch(compute: torch.dtype, rows: int, weight: torch.Tensor) -> bool:
    if compute != torch.float32:
        return False
    return rows <= _FP32_TORCH_ROWS or (rows <= _FP32_SMALL_ROWS and weight.numel() < _FP32_SMALL_WEIGHT)


def _fold(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """weight and bias of ``bn(linear(x))`` as one affine map, computed in float64 and returned in float32."""
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


def in_features_of(module: nn.Module) -> int:
    return module.weight.shape[1] if isinstance(module, nn.Linear) else module.weight.shape[0]


def _build(module: nn.Module, state: LayerState) -> _C.Linear:
    weight = weight_of(module).detach()
    bias = module.bias.detach() if module.bias is not None else None
    if state.bn is not None:
        weight, bias = _fold(weight, bias, state.bn)
    if bias is not None and bias.dtype not in (torch.float32, torch.bfloat16):
        bias = bias.float()
    if weight.dtype not in (torch.float32, torch.bfloat16):
        weight = weight.float()
    return _C.Linear(dlpack(weight), dlpack(bias) if bias is not None else None, COMPUTE_NAMES[state.compute])


def _tensors_of(module: nn.Module, state: LayerState) -> tuple[torch.Tensor | None, ...]:
    tensors: tuple[torch.Tensor | None, ...] = (module.weight, module.bias)
    if state.bn is not None:
        bn = state.bn
        tensors += (bn.weight, bn.bias, bn.running_mean, bn.running_var)
    return tensors


def kernel_of(module: nn.Module, state: LayerState) -> _C.Linear:
    """The module's oneDNN layer, built (or rebuilt, after its weights changed) on demand."""
    return state.cache.get(_tensors_of(module, state), lambda: _build(module, state))


def fast_path_allowed(modules: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Eval mode, and nothing autograd would have to differentiate through."""
    if any(m.training for m in modules):
        return False
    if not torch.is_grad_enabled():
        return True
    if x.requires_grad:
        return False
    return not any(p.requires_grad for m in modules for p in m.parameters(recurse=False))


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
    if x.device.type != "cpu" or x.dim() == 0 or x.shape[-1] != in_features_of(module):
        return None
    if x.dtype != compute:
        # bf16 layers take fp32 inputs the way autocast would; fp32 layers under a bf16 autocast, or given
        # another dtype, are torch's to run (and to refuse).
        if not (compute == torch.bfloat16 and x.dtype == torch.float32):
            return None
        x = x.to(compute)
    elif compute == torch.float32 and cpu_autocast_enabled():
        return None
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if prefers_torch(compute, rows, module.weight):
        return None
    kernel = kernel_of(module, state)
    out = torch.empty((rows, kernel.out_features), dtype=compute)
    res = None
    if residual is not None:
        if residual.shape != (*lead, kernel.out_features) or residual.dtype not in (torch.float32, torch.bfloat16):
            return None
        res = residual.reshape(rows, kernel.out_features)
        if res.stride(-1) != 1:
            res = res.contiguous()
        res = dlpack(res)
    sync_threads()
    kernel.forward(dlpack(x2), None, dlpack(out), list(epilogue), res)
    return out.reshape(*lead, kernel.out_features)


class LinearForward:
    """The forward of an optimized ``nn.Linear`` or ``Conv1D``, installed on the instance (``module.forward``), so
    the module keeps its class, parameters and state_dict. In eval mode without autograd it runs on ember's oneDNN
    matmul with the weight prepacked once; otherwise, and for a layer whose BatchNorm is folded in by its
    container, the class's own forward runs."""

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

    def __repr__(self) -> str:
        return f"LinearForward({type(self.module).__name__}, {self.state})"
