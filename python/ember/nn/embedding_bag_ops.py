"""The ``torch.ops.ember.merged_embedding_bag`` operators: the forward (with its autograd formula, dense or sparse
gradients), the out= form, and the backward companions, each a kernel function on ember's core and a fake for
tracing. ``ember.nn.embedding_bag`` is the user's door to them; ``embedding_bag_fused`` adds the fused updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack

from ember import _C
from ember._library import define, dispatcher_needed, needs_input_grad
from ember._tensor import arithmetic_dtype, dlpack, sync_threads

_INDEX_DTYPES = (torch.int32, torch.int64)

Tensors = list[torch.Tensor]  # one entry per table


def kernel_inputs(
    weights: list[torch.Tensor],
    indices: list[torch.Tensor],
    offsets: list[torch.Tensor],
    per_sample_weights: list[torch.Tensor],
) -> tuple[list[Any], list[Any], list[Any]]:
    """DLPack capsules of the lookup tensors as the core takes them: contiguous, offsets of the indices' dtype,
    per-sample weights in the table's arithmetic dtype (None for a table without)."""
    idx = [dlpack(i.contiguous()) for i in indices]
    # offsets follow their indices' dtype; beside indices of another dtype they go as they are (the core refuses
    # the indices, by name)
    off = [dlpack((_as_dtype("offsets", t, o, i.dtype) if i.dtype in _INDEX_DTYPES else o).contiguous())
           for t, (o, i) in enumerate(zip(offsets, indices))]  # fmt: skip
    psw = [dlpack(_as_dtype("per_sample_weights", t, p, arithmetic_dtype(w.dtype)).contiguous()) if given(p) else None
           for t, (p, w) in enumerate(zip(per_sample_weights, weights))]  # fmt: skip
    return idx, off, psw


def _as_dtype(name: str, t: int, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``, converted only within its kind: integers to integers (offsets), real floating point to
    real floating point (per-sample weights). A float offset or a complex weight would be truncated silently, so
    it is refused, naming the argument (the core's own check would only see the converted tensor)."""
    # Tensor.to parses its arguments even when there is nothing to convert (about 1 us; 26 tables pay it twice).
    if x.dtype == dtype:
        return x
    same_kind = (x.is_floating_point() and dtype.is_floating_point) or (
        not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool and not dtype.is_floating_point
    )
    if not same_kind:
        kind = "floating point" if dtype.is_floating_point else "int32 or int64"
        raise TypeError(f"merged_embedding_bag: {name}[{t}] must be {kind}, got {x.dtype}")
    return x.to(dtype)


def given(per_sample_weights: torch.Tensor) -> bool:
    """The operators take per_sample_weights as a Tensor[] with an empty 2-D tensor for a table that has none (a
    Tensor?[] with None entries gets no gradients through torch.library.register_autograd); real ones are 1-D."""
    return per_sample_weights.dim() == 1


def num_bags(offsets: torch.Tensor, include_last_offset: bool) -> int:
    return offsets.shape[0] - (1 if include_last_offset else 0)


def _forward_kernel(
    weights: list[torch.Tensor],
    indices: list[torch.Tensor],
    offsets: list[torch.Tensor],
    per_sample_weights: list[torch.Tensor],
    mode: str,
    include_last_offset: bool,
    sparse: bool,
) -> list[torch.Tensor]:
    outs = [w.new_empty(num_bags(o, include_last_offset), w.shape[1]) for w, o in zip(weights, offsets)]
    _forward_out_kernel(weights, indices, offsets, per_sample_weights, mode, include_last_offset, outs)
    return outs


def _forward_out_kernel(
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
    out: Tensors,
) -> None:
    """The pooled bags of every table into out[t] (checked by the core: shapes, dtypes, no overlap)."""
    idx, off, psw = kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    _C.merged_embedding_bag_forward([dlpack(w.contiguous()) for w in weights], idx, off, psw,
                                    [dlpack(o) for o in out], mode=mode,
                                    include_last_offset=include_last_offset)  # fmt: skip


def _forward_out_fake(
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
    out: Tensors,
) -> None:
    return None


def _forward_fake(
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
    sparse: bool,
) -> Tensors:
    return [w.new_empty(num_bags(o, include_last_offset), w.shape[1]) for w, o in zip(weights, offsets)]


def _row_gradients(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table, (rows, values): the rows the bags touched, ascending, and their gradients in the weight's dtype."""
    idx, off, psw = kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    pairs = _C.merged_embedding_bag_backward([dlpack(w.contiguous()) for w in weights], idx, off, psw,
                                             [dlpack(g.to(w.dtype).contiguous()) for g, w in zip(grads, weights)],
                                             mode=mode, include_last_offset=include_last_offset)  # fmt: skip
    return [(from_dlpack(r), from_dlpack(v).to(w.dtype)) for (r, v), w in zip(pairs, weights)]


def _dense_backward_kernel(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> Tensors:
    out = []
    for (rows, values), w in zip(_row_gradients(grads, weights, indices, offsets, per_sample_weights, mode,
                                                include_last_offset), weights):  # fmt: skip
        dense = torch.zeros_like(w)
        dense.index_copy_(0, rows, values)
        out.append(dense)
    return out


def _dense_backward_fake(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> Tensors:
    return [torch.empty_like(w) for w in weights]


def _sparse_backward_kernel(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> tuple[Tensors, Tensors]:
    pairs = _row_gradients(grads, weights, indices, offsets, per_sample_weights, mode, include_last_offset)
    return [rows for rows, _ in pairs], [values for _, values in pairs]


def _sparse_backward_fake(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> tuple[Tensors, Tensors]:
    if not hasattr(torch.library, "get_ctx"):
        raise NotImplementedError("merged_embedding_bag: sparse gradients need torch >= 2.2 under fake tensors")
    ctx = torch.library.get_ctx()
    rows, values = [], []
    for w in weights:
        touched = ctx.new_dynamic_size()  # how many rows a batch touches is known only from the data
        rows.append(w.new_empty(touched, dtype=torch.int64))
        values.append(w.new_empty(touched, w.shape[1]))
    return rows, values


def _per_sample_backward_kernel(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> Tensors:
    outs = [torch.empty(p.shape, dtype=arithmetic_dtype(w.dtype)) for p, w in zip(per_sample_weights, weights)]
    idx, off, psw = kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    _C.merged_embedding_bag_per_sample_weights_backward(
        [dlpack(w.contiguous()) for w in weights], idx, off, psw,
        [dlpack(g.to(w.dtype).contiguous()) for g, w in zip(grads, weights)],
        [dlpack(o) if given(w) else None for w, o in zip(per_sample_weights, outs)],
        mode=mode, include_last_offset=include_last_offset)  # fmt: skip
    return [o.to(w.dtype) for w, o in zip(per_sample_weights, outs)]


def _per_sample_backward_fake(
    grads: Tensors,
    weights: Tensors,
    indices: Tensors,
    offsets: Tensors,
    per_sample_weights: Tensors,
    mode: str,
    include_last_offset: bool,
) -> Tensors:
    return [torch.empty_like(w) for w in per_sample_weights]


_SIGNATURE = ("Tensor[] weights, Tensor[] indices, Tensor[] offsets, Tensor[] per_sample_weights, str mode, "
              "bool include_last_offset")  # fmt: skip

_dense_backward: Callable[..., list[torch.Tensor]] = define(
    f"merged_embedding_bag_dense_backward(Tensor[] grads, {_SIGNATURE}) -> Tensor[]",
    _dense_backward_kernel,
    fake=_dense_backward_fake,
)
_sparse_backward: Callable[..., tuple[list[torch.Tensor], list[torch.Tensor]]] = define(
    f"merged_embedding_bag_sparse_backward(Tensor[] grads, {_SIGNATURE}) -> (Tensor[], Tensor[])",
    _sparse_backward_kernel,
    fake=_sparse_backward_fake,
)
per_sample_backward: Callable[..., list[torch.Tensor]] = define(
    f"merged_embedding_bag_per_sample_weights_backward(Tensor[] grads, {_SIGNATURE}) -> Tensor[]",
    _per_sample_backward_kernel,
    fake=_per_sample_backward_fake,
)


def _sparse_rows(rows: torch.Tensor, values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A coalesced sparse COO gradient (unique, ascending rows: nothing for torch to check or merge)."""
    if _SPARSE_KWARGS:
        # check_invariants=False alone still warns under torch 2.11 ("Sparse invariant checks are implicitly
        # disabled", pytorch/pytorch#178274): its factory reads the global flag first, which this scope sets.
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, is_coalesced=True, check_invariants=False)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape)._coalesced_(True)  # torch < 2.1


_SPARSE_KWARGS = "is_coalesced" in (torch.sparse_coo_tensor.__doc__ or "")


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.lookup = inputs  # weights, indices, offsets, per_sample_weights, mode, include_last_offset, sparse


def _backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[Any, ...]:
    weights, indices, offsets, per_sample_weights, mode, include_last_offset, sparse = ctx.lookup
    needs = needs_input_grad(ctx)
    needs_weights, needs_psw = needs[0], needs[3]
    untouched = [None] * len(weights)  # the returned structure mirrors the inputs'
    grads = [w.new_zeros(num_bags(o, include_last_offset), w.shape[1]) if g is None else g
             for g, w, o in zip(grads, weights, offsets)]  # fmt: skip
    args = (grads, weights, indices, offsets, per_sample_weights, mode, include_last_offset)
    weight_grads: list[torch.Tensor | None] = list(untouched)
    if any(needs_weights):
        if sparse:
            rows, values = _sparse_backward(*args)
            weight_grads = [_sparse_rows(r, v, w.shape) for r, v, w in zip(rows, values, weights)]
        else:
            weight_grads = list(_dense_backward(*args))
        weight_grads = [g if needed else None for g, needed in zip(weight_grads, needs_weights)]
    psw_grads: list[torch.Tensor | None] = list(untouched)
    if any(needed and given(w) for needed, w in zip(needs_psw, per_sample_weights)):
        psw_grads = [g if needed and given(w) else None
                     for g, w, needed in zip(per_sample_backward(*args), per_sample_weights, needs_psw)]  # fmt: skip
    return weight_grads, untouched, untouched, psw_grads, None, None, None


_forward: Callable[..., list[torch.Tensor]] = define(
    f"merged_embedding_bag({_SIGNATURE}, bool sparse) -> Tensor[]",
    _forward_kernel,
    fake=_forward_fake,
    backward=_backward,
    setup_context=_setup_context,
)


# Pooling into tensors the caller owns (out=): a serving loop that reuses its outputs skips one allocation a table
# and writes into memory the caches still hold. A mutating operator, so it has no autograd formula. Its string
# argument is not called `mode`: torch.compile's auto_functionalized passes a mutating operator's arguments by name
# beside a `mode` of its own (torch 2.13: "got multiple values for argument 'mode'").
_forward_out: Callable[..., None] = define(
    "merged_embedding_bag_out(Tensor[] weights, Tensor[] indices, Tensor[] offsets, Tensor[] per_sample_weights, "
    "str pooling, bool include_last_offset, Tensor(a!)[] out) -> ()",
    _forward_out_kernel,
    fake=_forward_out_fake,
)


def run_lookup(
    weights: list[torch.Tensor],
    indices: list[torch.Tensor],
    offsets: list[torch.Tensor],
    per_sample_weights: list[torch.Tensor],
    mode: str,
    include_last_offset: bool,
    sparse: bool,
    out: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """The forward operator on normalized lists, or its kernel function straight away where the dispatcher would
    only pass the call through (see dispatcher_needed): no gradient wanted, eager, nothing watching. With `out`,
    the pooling goes into those tensors, which it returns."""
    if out is not None:
        out_args = (weights, indices, offsets, per_sample_weights, mode, include_last_offset, out)
        if dispatcher_needed(weights + per_sample_weights, indices + offsets + out):
            _forward_out(*out_args)
        else:
            _forward_out_kernel(*out_args)
        return out
    args = (weights, indices, offsets, per_sample_weights, mode, include_last_offset, sparse)
    if dispatcher_needed(weights + per_sample_weights, indices + offsets):
        return _forward(*args)
    return _forward_kernel(*args)
