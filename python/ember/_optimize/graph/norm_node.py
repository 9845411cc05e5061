"""The module graph mode puts in place of a LayerNorm or RMSNorm, with the residual add before it: ``norm(x +
residual)`` (or ``norm(x)``) on ember's row-norm kernel (csrc/norm/row_norm.cpp), the sum returned beside the
result where the graph reads it elsewhere (a pre-norm block's residual stream).

The node keeps the graph's own operations it replaced, as a small GraphModule (``original``), and runs them whenever
the kernel does not take a call (autograd, odd dtypes or shapes, torch.jit.trace recording). The dtype of each
result is the one those operations give for the call's dtypes under the autocast state of the call (a Llama
RMSNorm's result takes its weight's dtype, a LayerNorm's its input's): it is found by running them once on one row
of the call's tensors, and remembered per combination of dtypes (with whether the kernel takes them: a plan).

Inside a forward whose guard passed (fast_calls.GraphGuard: autograd off, no trace, profiler or dispatch mode,
threads synced), a call like the last one the kernel ran (:class:`FastNorm`: the same shape, dtypes and strides,
the same autocast state) allocates its results and calls the kernel: on the 16-core Xeon a norm node's general
call spent about 30 us of Python per call inside BERT's forward, beside 20-40 us of kernel.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import fx, nn

from ember import _C
from ember._optimize.graph.fast_calls import CHECKED, RECORDING
from ember._optimize.graph.probe import KERNEL_DTYPES
from ember._optimize.inference.common import cpu_autocast_dtype, tensors_allow_fast_path
from ember._optimize.inference.state import TensorRef
from ember._tensor import dlpack, sync_threads

# The dtypes of one call, which decide the dtypes of its results: x, residual, weight, bias and autocast's dtype.
_DtypeKey = tuple[Any, ...]
# A call's plan: the dtypes of its result and of the sum it returns (None: it returns none).
_Plan = tuple[torch.dtype, "torch.dtype | None"]


class FusedNorm(nn.Module):
    """``norm(x [+ residual])`` over the last ``normalized_dims`` dimensions: ``kind`` "layer" (LayerNorm) or "rms"
    (RMSNorm), ``eps`` (None: the input dtype's machine epsilon, as ``F.rms_norm`` takes it). The weight and bias
    are read through refs into the model, or passed as call arguments after the residual in a graph that passes
    its tensors (dynamo's). ``adds_residual``: the graph added a residual before the norm (the call passes it).

    Returns the result alone, or a tuple of it, ``x + residual`` where ``returns_sum``, and where ``bf16_copy`` the
    result in bf16 for the layers computing in bf16 that read it (an fp32 result rounded once, in the same pass,
    where each layer would round it again; a result of another dtype as it is). Where the graph reads the result
    only through that copy (``result_read`` False: a pre-norm block's norm, read by its projections alone), the
    kernel writes the copy alone, and the tuple holds it in the result's place too (where nothing reads it)."""

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
        bf16_copy: bool = False,
        result_read: bool = True,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.eps = eps
        self.normalized_dims = normalized_dims
        self.refs = refs
        self.original = original  # (x, residual, weight, bias) -> result, or (result, sum)
        self.adds_residual = adds_residual
        self.returns_sum = returns_sum
        self.bf16_copy = bf16_copy
        self.result_read = result_read
        self.origin = origin
        self._plans: dict[_DtypeKey, _Plan | None] = {}
        self._fast: FastNorm | None = None

    def forward(self, x: torch.Tensor, residual: Any = None, *passed: torch.Tensor | None) -> Any:
        if passed:
            weight, bias = passed
        else:
            weight_ref, bias_ref = self.refs
            weight = None if weight_ref is None else weight_ref.get()
            bias = None if bias_ref is None else bias_ref.get()
            fast = self._fast
            if fast is not None and CHECKED.epoch:
                out = fast(x, residual, weight, bias)
                if out is not None:
                    return out
        plain = isinstance(x, torch.Tensor) and (residual is None or isinstance(residual, torch.Tensor))
        if plain and tensors_allow_fast_path((weight, bias, residual), x):
            out = self._on_kernel(x, residual, weight, bias)
            if out is not None:
                return out
        results = self.original(x, residual, weight, bias)
        result, total = results if self.returns_sum else (results, None)
        low = result.to(torch.bfloat16) if self.bf16_copy and result.dtype == torch.float32 else None
        return self._results(result, total, low)

    def __getstate__(self) -> dict[str, Any]:
        # A copy or pickle makes its own fast call on its first kernel call (this one points at this node).
        return {**self.__dict__, "_fast": None}

    @property
    def outputs(self) -> int:
        """How many results a call returns as a tuple (0: the result alone, not in a tuple)."""
        count = 1 + int(self.returns_sum) + int(self.bf16_copy)
        return count if count > 1 else 0

    def _on_kernel(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> Any:
        key = (
            x.dtype, None if residual is None else residual.dtype, None if weight is None else weight.dtype,
            None if bias is None else bias.dtype, cpu_autocast_dtype(),
        )  # fmt: skip
        if key in self._plans:
            plan = self._plans[key]
        else:
            plan = self._plans[key] = self._plan(x, residual, weight, bias)
        if plan is None or not x.is_cpu or x.numel() == 0:
            return None
        dims = self.normalized_dims
        shape = x.shape
        if len(shape) < dims or (residual is not None and (residual.shape != shape or not residual.is_cpu)):
            return None
        cols = shape[-1] if dims == 1 else math.prod(shape[len(shape) - dims :])
        if (weight is not None and weight.numel() != cols) or (bias is not None and bias.numel() != cols):
            return None
        out_dtype, sum_dtype = plan
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        strided = None if x.is_contiguous() else x.stride()
        if dims == 1 and (residual is None or residual.is_contiguous()) and (strided is None or strided[-1] != 1):
            # The hot path: read in place, results allocated like x (torch.empty_like: no size parsing, no view). An x
            # whose features do not lie side by side (Whisper's first encoder norm reads its permuted frames) is
            # copied first, as the general path below would, and its fast call repeats the copy; rows merely apart
            # (a slice) are read in place below.
            if strided is not None:
                x = x.contiguous()
            out_dtype, copies = self._written(out_dtype)
            out = torch.empty_like(x, dtype=out_dtype)
            sum_out = torch.empty_like(x, dtype=sum_dtype) if self.returns_sum else None
            low = torch.empty_like(x, dtype=torch.bfloat16) if copies else None
            w, b = _vector(weight), _vector(bias)
            sync_threads()
            self._kernel(x, residual, w, b, eps, out, sum_out, low)
            # (a weight or bias that had to be flattened, rare, keeps the general call)
            self._fast = FastNorm(self, x, residual, w, b, eps, plan, strided) if w is weight and b is bias else None
            return self._results(out, sum_out, low)
        x_rows = _rows(x, cols)
        out_dtype, copies = self._written(out_dtype)
        out = torch.empty(x_rows.shape, dtype=out_dtype)
        sum_out = torch.empty(x_rows.shape, dtype=sum_dtype) if self.returns_sum else None
        low = torch.empty(x_rows.shape, dtype=torch.bfloat16) if copies else None
        rows_residual = None if residual is None else _rows(residual, cols)
        sync_threads()
        self._kernel(x_rows, rows_residual, _vector(weight), _vector(bias), eps, out, sum_out, low)
        return self._results(
            out.view(shape), None if sum_out is None else sum_out.view(shape), None if low is None else low.view(shape)
        )

    def _written(self, out_dtype: torch.dtype) -> tuple[torch.dtype, bool]:
        """The dtype the kernel writes the result in, and whether it writes a bf16 copy beside it: an fp32 result
        that only bf16 layers read is written in bf16 alone (rounded once, as the copy would be)."""
        if not self.bf16_copy or out_dtype != torch.float32:
            return out_dtype, False
        return (torch.float32, True) if getattr(self, "result_read", True) else (torch.bfloat16, False)

    def _results(self, out: torch.Tensor, sum_out: torch.Tensor | None, low: torch.Tensor | None) -> Any:
        if self.outputs == 0:
            return out
        results = (out,) if sum_out is None else (out, sum_out)
        if self.bf16_copy:
            results = (*results, out if low is None else low)  # a bf16 result is its own copy
        return results

    def _kernel(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        out: torch.Tensor,
        sum_out: torch.Tensor | None,
        low: torch.Tensor | None,
    ) -> None:
        """The kernel's call, the weight and bias already vectors (or none)."""
        # (torch's to_dlpack takes a parameter as it is: the kernel only reads it, under the fast path's no-autograd
        # rule)
        _C.row_norm(
            self.kind, dlpack(x), None if residual is None else dlpack(residual),
            None if weight is None else dlpack(weight), None if bias is None else dlpack(bias), eps,
            dlpack(out), None if sum_out is None else dlpack(sum_out), None if low is None else dlpack(low),
        )  # fmt: skip

    def _plan(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> _Plan | None:
        """The dtypes of the result and the sum for operands of these dtypes (under the autocast now), or None where
        the kernel does not take them."""
        tensors = [t for t in (x, residual, weight, bias) if t is not None]
        if any(t.dtype not in KERNEL_DTYPES for t in tensors):
            return None
        if weight is not None and bias is not None and weight.dtype != bias.dtype:
            return None
        result_dtypes = self._result_dtypes(x, residual, weight, bias)
        sum_dtype = None
        if self.returns_sum:
            sum_dtype = result_dtypes[1]
            if residual is None or sum_dtype != torch.promote_types(x.dtype, residual.dtype):
                return None  # the kernel keeps the sum in the dtype torch's add gives it
        if result_dtypes[0] not in KERNEL_DTYPES:
            return None
        return result_dtypes[0], sum_dtype

    def _result_dtypes(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> tuple[torch.dtype, ...]:
        """The dtypes of the results the graph's own operations give for these operands, now: run on one row."""
        one_row = tuple(slice(0, 1) for _ in range(x.dim() - self.normalized_dims))
        r = None if residual is None else residual[one_row]
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what torch says of these dtypes, it says on the user's own call
                results = self.original(x[one_row], r, weight, bias)
            return tuple(t.dtype for t in (results if isinstance(results, tuple) else (results,)))
        except RuntimeError:
            # This torch refuses the mix (torch 1.13: a bf16 input beside fp32 weights): the dtypes newer torch
            # gives it, the input's for the result and the promoted one for the sum.
            return x.dtype, x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)

    def extra_repr(self) -> str:
        added = "residual add, then " if self.adds_residual else ""
        kept = ", keeps the sum" if self.returns_sum else ""
        copy = ""
        if self.bf16_copy:
            copy = ", writes a bf16 copy" if getattr(self, "result_read", True) else ", writes it in bf16 alone"
        return f"{self.origin}: {added}{'RMSNorm' if self.kind == 'rms' else 'LayerNorm'}{kept}{copy}"


class FastNorm:
    """A norm node's call for operands like those of the last call its kernel ran in place: x contiguous (or at the
    strides of a non-contiguous x the last call copied first: ``strided``), of one shape and dtype; a residual of that
    shape, contiguous, of one dtype, or none; a weight and a bias that are
    vectors of one dtype each, or none; the same autocast state (which decides the results' dtypes). Taken only
    inside a forward whose guard passed; anything else returns None, for the general call."""

    __slots__ = ("autocast", "bias", "dtype", "eps", "low", "node", "out_dtype", "residual", "shape", "strided",
                 "sum_dtype", "weight")  # fmt: skip

    def __init__(
        self,
        node: FusedNorm,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        plan: _Plan,
        strided: tuple[int, ...] | None = None,
    ) -> None:
        self.node = node
        self.strided = strided
        self.shape, self.dtype = x.shape, x.dtype
        self.residual = None if residual is None else residual.dtype
        self.weight = None if weight is None else (weight.dtype, weight.numel())
        self.bias = None if bias is None else (bias.dtype, bias.numel())
        self.autocast = cpu_autocast_dtype()
        self.eps = eps
        self.out_dtype, self.sum_dtype = plan
        self.out_dtype, self.low = node._written(self.out_dtype)

    def __call__(self, x: Any, residual: Any, weight: torch.Tensor | None, bias: torch.Tensor | None) -> Any:
        if not isinstance(x, torch.Tensor) or x.shape != self.shape or x.dtype != self.dtype:
            return None
        if not x.is_cpu or torch.is_grad_enabled():
            return None
        copied = None
        if not x.is_contiguous():
            if x.stride() != self.strided:
                return None
            copied = x.contiguous()
        if residual is None:
            if self.residual is not None:
                return None
        elif (not isinstance(residual, torch.Tensor) or residual.dtype != self.residual
              or residual.shape != self.shape or not residual.is_contiguous() or not residual.is_cpu):  # fmt: skip
            return None
        if not (_same_vector(weight, self.weight) and _same_vector(bias, self.bias)):
            return None
        if cpu_autocast_dtype() != self.autocast:
            return None
        node = self.node
        recorder = RECORDING.active
        if copied is not None:
            if recorder is not None:
                recorder.moved(x, copied)
            x = copied
        out = torch.empty_like(x, dtype=self.out_dtype)
        sum_out = None if self.sum_dtype is None else torch.empty_like(x, dtype=self.sum_dtype)
        low = torch.empty_like(x, dtype=torch.bfloat16) if self.low else None
        node._kernel(x, residual, weight, bias, self.eps, out, sum_out, low)
        if recorder is not None:
            recorder.row_norm(node.kind, x, residual, weight, bias, self.eps, out, sum_out, low, node.refs)
        return node._results(out, sum_out, low)


def _same_vector(t: torch.Tensor | None, kind: tuple[torch.dtype, int] | None) -> bool:
    """``t`` is none where ``kind`` is, else a dense vector of its dtype and length (a parameter re-pointed through
    ``.data`` can change both)."""
    if t is None or kind is None:
        return t is None and kind is None
    return t.dtype == kind[0] and t.dim() == 1 and t.numel() == kind[1] and t.is_contiguous()


def _rows(t: torch.Tensor, cols: int) -> torch.Tensor:
    """``t`` as the ``[rows, cols]`` matrix the kernel reads, the features of stride 1 (a copy only where the
    layout needs one; a residual broadcast over rows stays a view of row stride 0)."""
    rows = t.reshape(-1, cols)
    if rows.stride(-1) == 1 or cols <= 1:
        return rows
    # Copied as more than two dimensions, then flattened: torch copies a transposed 2-D view on one thread (its
    # blocked transpose, taken for any such matrix of 3600 elements or more), where a copy of more dimensions runs
    # on every thread. Whisper's first norm, its input a convolution's output permuted: 1 ms a call against 42 us.
    return t.unsqueeze(0).contiguous().view(-1, cols)


def _vector(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as the kernel reads it: one contiguous vector (itself where it is one already)."""
    if p is None or (p.dim() == 1 and p.is_contiguous()):
        return p
    return p.detach().reshape(-1).contiguous()
