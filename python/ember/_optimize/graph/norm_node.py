"""The module graph mode puts in place of a LayerNorm or RMSNorm, with the residual add before it: ``norm(x +
residual)`` (or ``norm(x)``) on ember's row-norm kernel (csrc/norm/row_norm.cpp), the sum returned beside the
result where the graph reads it elsewhere (a pre-norm block's residual stream).

The node keeps the graph's own operations it replaced, as a small GraphModule (``original``), and runs them whenever
the kernel does not take a call (autograd, odd dtypes or shapes, torch.jit.trace recording). The dtype of each
result is the one those operations give for the call's dtypes under the autocast state of the call (a Llama
RMSNorm's result takes its weight's dtype, a LayerNorm's its input's): it is found by running them once on one row
of the call's tensors, and remembered per combination of dtypes.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import fx, nn

from ember import _C
from ember._optimize.inference.common import cpu_autocast_dtype, tensors_allow_fast_path
from ember._optimize.inference.state import TensorRef
from ember._tensor import dlpack, sync_threads

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)

# The dtypes of one call, which decide the dtypes of its results: x, residual, weight, bias and autocast's dtype.
_DtypeKey = tuple[Any, ...]


class FusedNorm(nn.Module):
    """``norm(x [+ residual])`` over the last ``normalized_dims`` dimensions: ``kind`` "layer" (LayerNorm) or "rms"
    (RMSNorm), ``eps`` (None: the input dtype's machine epsilon, as ``F.rms_norm`` takes it). The weight and bias
    are read through refs into the model, or passed as call arguments after the residual in a graph that passes
    its tensors (dynamo's). ``adds_residual``: the graph added a residual before the norm (the call passes it);
    returns the result, or ``(result, x + residual)`` where ``returns_sum``."""

    def __init__(
        self,
        kind: str,
        eps: float | None,
        normalized_dims: int,
        refs: tuple[TensorRef | None, TensorRef | None],
        original: fx.GraphModule,
        adds_residual: bool,
        returns_sum: bool,
        origin: str,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.eps = eps
        self.normalized_dims = normalized_dims
        self.refs = refs
        self.original = original  # (x, residual, weight, bias) -> result, or (result, sum)
        self.adds_residual = adds_residual
        self.returns_sum = returns_sum
        self.origin = origin
        self._result_dtypes: dict[_DtypeKey, tuple[torch.dtype, ...]] = {}

    def forward(self, x: torch.Tensor, residual: Any = None, *passed: torch.Tensor | None) -> Any:
        weight, bias = passed if passed else tuple(None if r is None else r.get() for r in self.refs)
        plain = isinstance(x, torch.Tensor) and (residual is None or isinstance(residual, torch.Tensor))
        if plain and tensors_allow_fast_path((weight, bias, residual), x):
            out = self._on_kernel(x, residual, weight, bias)
            if out is not None:
                return out
        return self.original(x, residual, weight, bias)

    def _on_kernel(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> Any:
        dims = self.normalized_dims
        if x.dim() < dims or x.dtype not in _KERNEL_DTYPES or x.device.type != "cpu" or x.numel() == 0:
            return None
        if residual is not None and (residual.shape != x.shape or residual.dtype not in _KERNEL_DTYPES):
            return None
        cols = math.prod(x.shape[x.dim() - dims :])
        params = [p for p in (weight, bias) if p is not None]
        if any(p.numel() != cols or p.dtype not in _KERNEL_DTYPES for p in params):
            return None
        if len(params) == 2 and params[0].dtype != params[1].dtype:
            return None
        result_dtypes = self._dtypes_of(x, residual, weight, bias)
        if result_dtypes[0] not in _KERNEL_DTYPES:
            return None
        if (
            self.returns_sum
            and residual is not None
            and result_dtypes[1] != torch.promote_types(x.dtype, residual.dtype)
        ):
            return None  # the kernel keeps the sum in the dtype torch's add gives it
        x_rows = _rows(x, cols)
        out = torch.empty(x_rows.shape, dtype=result_dtypes[0])
        sum_out = torch.empty(x_rows.shape, dtype=result_dtypes[1]) if self.returns_sum else None
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        sync_threads()
        _C.row_norm(
            self.kind, dlpack(x_rows), None if residual is None else dlpack(_rows(residual, cols)),
            _param(weight), _param(bias), eps, dlpack(out), None if sum_out is None else dlpack(sum_out),
        )  # fmt: skip
        if sum_out is None:
            return out.view(x.shape)
        return out.view(x.shape), sum_out.view(x.shape)

    def _dtypes_of(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> tuple[torch.dtype, ...]:
        """The dtypes of the results the graph's own operations give for these operands, now."""
        key = (x.dtype, *(None if t is None else t.dtype for t in (residual, weight, bias)), cpu_autocast_dtype())
        found = self._result_dtypes.get(key)
        if found is None:
            one_row = tuple(slice(0, 1) for _ in range(x.dim() - self.normalized_dims))
            r = None if residual is None else residual[one_row]
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # what torch says of these dtypes, it says on the user's own call
                    results = self.original(x[one_row], r, weight, bias)
                results = results if isinstance(results, tuple) else (results,)
                found = tuple(t.dtype for t in results)
            except RuntimeError:
                # This torch refuses the mix (torch 1.13: a bf16 input beside fp32 weights): the dtypes newer
                # torch gives it, the input's for the result and the promoted one for the sum.
                found = (x.dtype, x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype))
            self._result_dtypes[key] = found
        return found

    def extra_repr(self) -> str:
        added = "residual add, then " if self.adds_residual else ""
        kept = ", keeps the sum" if self.returns_sum else ""
        return f"{self.origin}: {added}{'RMSNorm' if self.kind == 'rms' else 'LayerNorm'}{kept}"


def _rows(t: torch.Tensor, cols: int) -> torch.Tensor:
    """``t`` as the ``[rows, cols]`` matrix the kernel reads, the features of stride 1 (a copy only where the
    layout needs one; a residual broadcast over rows stays a view of row stride 0)."""
    rows = t.reshape(-1, cols)
    return rows if rows.stride(-1) == 1 or cols <= 1 else rows.contiguous()


def _param(p: torch.Tensor | None) -> Any:
    return None if p is None else dlpack(p.detach().reshape(-1).contiguous())
