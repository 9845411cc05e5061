"""Merged embedding bags: many tables' bag lookups in one operator, and optimizer steps fused into their backward.

A DLRM-style model looks up 26 tables a batch; as a loop of ``nn.EmbeddingBag`` that is 26 operator calls, each its
own fork/join over the threads, and (with ``sparse=True``) 26 sparse gradients that the optimizer then coalesces
and applies one by one. ``MergedEmbeddingBag`` does every table's lookup in one call to ember's kernel
(csrc/embedding_bag); ``MergedEmbeddingBagWithSGD`` and ``MergedEmbeddingBagWithAdagrad`` also apply the optimizer
step inside the backward pass, to the rows the batch touched, with no gradient tensor at all.

Each table stays an ``nn.EmbeddingBag`` (the merged module is an ``nn.ModuleList`` of them), so a model's
``state_dict`` keeps the keys and shapes of the ModuleList it replaces (``emb_l.0.weight``, ...), and one line
switches a model over::

    self.emb_l = ember.nn.MergedEmbeddingBag.from_embeddingbag_list(self.emb_l)
    ...
    pooled = self.emb_l(indices, offsets)          # a list of [batch, dim] tensors, one per table

The operators are ``torch.ops.ember.merged_embedding_bag`` (forward, with its autograd formula) and its backward
and update companions, so ``torch.fx`` and ``torch.compile`` see one node per merged lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from ember import _C
from ember._library import define, dispatcher_needed, needs_input_grad, tracing
from ember._tensor import arithmetic_dtype, dlpack, require_tensor, sync_threads

__all__ = ["MergedEmbeddingBag", "merged_embedding_bag"]

_MODES = ("sum", "mean")


# --- the operators ---------------------------------------------------------------------------------------------------


_INDEX_DTYPES = (torch.int32, torch.int64)

Tensors = list[torch.Tensor]  # one entry per table


def _kernel_inputs(
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
    psw = [dlpack(_as_dtype("per_sample_weights", t, p, arithmetic_dtype(w.dtype)).contiguous()) if _given(p) else None
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


def _given(per_sample_weights: torch.Tensor) -> bool:
    """The operators take per_sample_weights as a Tensor[] with an empty 2-D tensor for a table that has none (a
    Tensor?[] with None entries gets no gradients through torch.library.register_autograd); real ones are 1-D."""
    return per_sample_weights.dim() == 1


def _num_bags(offsets: torch.Tensor, include_last_offset: bool) -> int:
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
    outs = [w.new_empty(_num_bags(o, include_last_offset), w.shape[1]) for w, o in zip(weights, offsets)]
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
    idx, off, psw = _kernel_inputs(weights, indices, offsets, per_sample_weights)
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
    return [w.new_empty(_num_bags(o, include_last_offset), w.shape[1]) for w, o in zip(weights, offsets)]


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
    idx, off, psw = _kernel_inputs(weights, indices, offsets, per_sample_weights)
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
    idx, off, psw = _kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    _C.merged_embedding_bag_per_sample_weights_backward(
        [dlpack(w.contiguous()) for w in weights], idx, off, psw,
        [dlpack(g.to(w.dtype).contiguous()) for g, w in zip(grads, weights)],
        [dlpack(o) if _given(w) else None for w, o in zip(per_sample_weights, outs)],
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
_per_sample_backward: Callable[..., list[torch.Tensor]] = define(
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
    grads = [w.new_zeros(_num_bags(o, include_last_offset), w.shape[1]) if g is None else g
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
    if any(needed and _given(w) for needed, w in zip(needs_psw, per_sample_weights)):
        psw_grads = [g if needed and _given(w) else None
                     for g, w, needed in zip(_per_sample_backward(*args), per_sample_weights, needs_psw)]  # fmt: skip
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


def _lookup(
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


def _check_out(out: object, weights: list[torch.Tensor], per_sample_weights: list[torch.Tensor]) -> list[Any]:
    """out= as the operator takes it: one tensor a table, and no gradient anywhere, since pooling into given tensors
    has no backward (torch's out= functions refuse alike). Layout, shape, dtype and overlaps are the binding's and
    the core's to check, before anything is written."""
    out = _as_list("out", out, len(weights))
    if tracing(*out):
        return out
    for t, o in enumerate(out):
        require_tensor("merged_embedding_bag", f"out[{t}]", o)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (*weights, *per_sample_weights, *out)):
        raise RuntimeError("merged_embedding_bag: out= does not support automatic differentiation, but a weight, "
                           "a per-sample weight or an output requires grad; call it under torch.no_grad() or "
                           "leave out= out")  # fmt: skip
    return out


# --- the functional form -------------------------------------------------------------------------------------------


def _as_list(name: str, value: object, count: int) -> list[Any]:
    if isinstance(value, torch.Tensor) or not isinstance(value, Sequence):
        raise TypeError(f"merged_embedding_bag: {name} must be a list with one entry per table, got "
                        f"{type(value).__name__}")  # fmt: skip
    if len(value) != count:
        raise ValueError(f"merged_embedding_bag: {name} must have one entry per table ({count}), got {len(value)}")
    return list(value)


def _normalize_table(
    t: int, indices: torch.Tensor, offsets: torch.Tensor | None, lengths: torch.Tensor | None, include_last_offset: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One table's indices as a 1-D tensor and its bag starts (the operators' offsets), from offsets, lengths or
    2-D (fixed-length) indices. The common form, 1-D indices with offsets, is checked first and passes as it is."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"merged_embedding_bag: indices[{t}] must be a torch.Tensor, got {type(indices).__name__}")
    dim = indices.dim()
    if dim == 1 and lengths is None:
        if offsets is None:
            raise ValueError(f"merged_embedding_bag: indices[{t}] is 1-D: it needs offsets or lengths")
        if not isinstance(offsets, torch.Tensor):
            raise TypeError(f"merged_embedding_bag: offsets[{t}] must be a torch.Tensor, got {type(offsets).__name__}")
        return indices, offsets
    if dim == 2:
        if offsets is not None or lengths is not None:
            raise ValueError(f"merged_embedding_bag: indices[{t}] is 2-D (one bag per row): give no offsets or "
                             "lengths for it")  # fmt: skip
        bags, width = indices.shape
        flat, starts = indices.reshape(-1), torch.arange(0, bags * width, width, dtype=indices.dtype)
    elif dim != 1:
        raise ValueError(f"merged_embedding_bag: indices[{t}] must be 1-D (with offsets) or 2-D, got {dim}-D")
    else:
        if offsets is not None:
            raise ValueError("merged_embedding_bag: give offsets or lengths, not both")
        flat, starts = indices, _starts_of_lengths(t, lengths, indices)
    if include_last_offset:  # the starts made here have one entry a bag; the end of the last one follows
        starts = torch.cat([starts, starts.new_tensor([flat.shape[0]])])
    return flat, starts


def _starts_of_lengths(t: int, lengths: object, indices: torch.Tensor) -> torch.Tensor:
    """Each bag's start from per-bag ``lengths``: 1-D integers >= 0 that add up to the number of indices (the last
    bag ends where the indices do, so a sum that differs would pool other rows than the lengths say)."""
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"merged_embedding_bag: lengths[{t}] must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dim() != 1 or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"merged_embedding_bag: lengths[{t}] must be a 1-D int32 or int64 tensor, got "
                         f"{tuple(lengths.shape)} {lengths.dtype}")  # fmt: skip
    if lengths.device != indices.device:
        raise RuntimeError(f"merged_embedding_bag: lengths[{t}] is on {lengths.device}, indices[{t}] on "
                           f"{indices.device}: expected all tensors to be on the same device")  # fmt: skip
    lengths64 = lengths.to(torch.int64)
    starts = torch.zeros(lengths.shape[0], dtype=indices.dtype, device=indices.device)
    if lengths.shape[0] > 1:
        starts[1:] = torch.cumsum(lengths64[:-1], 0)
    if lengths.is_meta:  # no values to check: shapes only, as every meta computation
        return starts
    if lengths64.numel() and int(lengths64.min()) < 0:
        raise ValueError(f"merged_embedding_bag: lengths[{t}] must be >= 0")
    total = int(lengths64.sum())
    if total != indices.shape[0]:
        raise ValueError(f"merged_embedding_bag: lengths[{t}] add up to {total}, but indices[{t}] has "
                         f"{indices.shape[0]} indices")  # fmt: skip
    return starts


def merged_embedding_bag(
    weights: Sequence[torch.Tensor],
    indices: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor] | None = None,
    per_sample_weights: Sequence[torch.Tensor | None] | None = None,
    *,
    lengths: Sequence[torch.Tensor] | None = None,
    mode: str = "sum",
    include_last_offset: bool = False,
    sparse: bool = False,
    out: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """``torch.nn.functional.embedding_bag`` over several tables in one operator: one [bags, dim] tensor per table.

    Per table t, ``indices[t]`` is 1-D with ``offsets[t]`` (each bag's start, as torch's) or ``lengths[t]`` (each
    bag's length), or 2-D [bags, length] for bags of one length. ``per_sample_weights[t]`` (mode "sum" only) weights
    each index; None for a table without. Gradients flow to the weights (dense, or sparse COO with
    ``sparse=True``, as ``nn.EmbeddingBag(sparse=True)`` gives them) and to the per-sample weights.

    ``out``, one contiguous [bags, dim] tensor a table in its weight's dtype, receives the pooled bags instead of
    new tensors and is returned (a serving loop that reuses it saves an allocation a table). It takes no part in
    autograd: with out= nothing may require grad while grad mode is on.
    """
    if mode not in _MODES:
        raise ValueError(f"merged_embedding_bag: mode must be 'sum' or 'mean', got {mode!r}")
    weights = list(weights)
    flat, starts, psw = _normalize_call(weights, indices, offsets, per_sample_weights, lengths, include_last_offset)
    if out is not None:
        out = _check_out(out, weights, psw)
    return _lookup(weights, flat, starts, psw, mode, include_last_offset, sparse, out)


def _normalize_call(
    weights: list[torch.Tensor],
    indices: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor] | None,
    per_sample_weights: Sequence[torch.Tensor | None] | None,
    lengths: Sequence[torch.Tensor] | None,
    include_last_offset: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """A lookup in the operators' form: per table 1-D indices, offsets, and per-sample weights or a placeholder."""
    count = len(weights)
    indices = _as_list("indices", indices, count)
    none: list[torch.Tensor | None] = [None] * count
    offsets_list = _as_list("offsets", offsets, count) if offsets is not None else none
    lengths_list = _as_list("lengths", lengths, count) if lengths is not None else none
    psw: list[torch.Tensor | None] = list(none)
    if per_sample_weights is not None:
        psw = _as_list("per_sample_weights", per_sample_weights, count)
    if tracing(*indices):
        if offsets is None or lengths is not None:
            raise ValueError("merged_embedding_bag: under torch.fx symbolic tracing give 1-D indices with offsets")
        return indices, cast(list[torch.Tensor], offsets_list), _placeholders(psw, weights)
    flat, starts = [], []
    for t in range(count):
        i, o = _normalize_table(t, indices[t], offsets_list[t], lengths_list[t], include_last_offset)
        flat.append(i)
        starts.append(o)
        given = psw[t]
        if given is not None and given.dim() == 2:
            psw[t] = given.reshape(-1)
    return flat, starts, _placeholders(psw, weights)


def _placeholders(per_sample_weights: list[torch.Tensor | None], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The operators' form of per_sample_weights: an empty 2-D tensor for a table that has none (see _given), one
    shared by every such table of the call (each tensor made costs about a microsecond)."""
    if all(p is not None for p in per_sample_weights):
        return per_sample_weights  # type: ignore[return-value]
    none = weights[0].new_empty(0, 0)
    return [none if p is None else p for p in per_sample_weights]


# --- the module ---------------------------------------------------------------------------------------------------


class MergedEmbeddingBag(nn.ModuleList):
    """Several ``nn.EmbeddingBag`` tables looked up in one call: ``forward(indices, offsets)`` returns one
    [bags, dim] tensor per table.

    It is the ``nn.ModuleList`` of its tables, so ``state_dict`` keys and shapes are the ModuleList's
    (``0.weight``, ``1.weight``, ...), ``merged[t]`` is table t (an ``nn.EmbeddingBag`` usable on its own), and
    tables may differ in rows and width. Every table shares the call's mode, ``include_last_offset`` and
    ``sparse``. ``max_norm``, ``padding_idx`` and ``scale_grad_by_freq`` are not supported (NotImplementedError).
    """

    def __init__(
        self,
        num_embeddings: Sequence[int],
        embedding_dim: int | Sequence[int],
        *,
        mode: str = "sum",
        include_last_offset: bool = False,
        sparse: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        dims = [embedding_dim] * len(num_embeddings) if isinstance(embedding_dim, int) else list(embedding_dim)
        if len(dims) != len(num_embeddings):
            raise ValueError(f"MergedEmbeddingBag: embedding_dim must be an int or one per table "
                             f"({len(num_embeddings)}), got {len(dims)}")  # fmt: skip
        tables = [nn.EmbeddingBag(rows, dim, mode=mode, include_last_offset=include_last_offset, sparse=sparse,
                                  dtype=dtype) for rows, dim in zip(num_embeddings, dims)]  # fmt: skip
        super().__init__(tables)
        self._check_tables()

    @classmethod
    def from_embeddingbag_list(cls, tables: Sequence[nn.EmbeddingBag], **kwargs: Any) -> MergedEmbeddingBag:
        """The merged form of existing tables, sharing their parameters (nothing is copied): a model's
        ``nn.ModuleList`` of ``nn.EmbeddingBag`` becomes this in one line, with the same state_dict keys."""
        merged = cls.__new__(cls)
        nn.ModuleList.__init__(merged, list(tables))
        merged._init_extra(**kwargs)
        merged._check_tables()
        return merged

    def _init_extra(self) -> None:
        """Subclasses take their own keyword arguments here (the optimizer's hyper-parameters)."""

    def _check_tables(self) -> None:
        if len(self) == 0:
            raise ValueError(f"{type(self).__name__}: needs at least one table")
        first = self[0]
        for t, table in enumerate(self):
            if not isinstance(table, nn.EmbeddingBag):
                raise TypeError(f"{type(self).__name__}: table {t} must be an nn.EmbeddingBag, got "
                                f"{type(table).__name__}")  # fmt: skip
            for name in ("max_norm", "padding_idx"):
                if getattr(table, name) is not None:
                    raise NotImplementedError(f"{type(self).__name__}: table {t} has {name} set; merged tables "
                                              "support neither max_norm nor padding_idx")  # fmt: skip
            if table.scale_grad_by_freq:
                raise NotImplementedError(f"{type(self).__name__}: table {t} has scale_grad_by_freq, which merged "
                                          "tables do not support")  # fmt: skip
            for name in ("mode", "include_last_offset", "sparse"):
                if getattr(table, name) != getattr(first, name):
                    raise ValueError(f"{type(self).__name__}: every table must have the same {name}; table 0 has "
                                     f"{getattr(first, name)!r}, table {t} {getattr(table, name)!r}")  # fmt: skip
        if first.mode not in _MODES:
            raise NotImplementedError(f"{type(self).__name__}: mode {first.mode!r} is not supported (sum or mean)")

    def _weights(self) -> list[torch.Tensor]:
        """Each table's weight, read from its parameter dict: nn.Module's __getattr__ costs about 0.4 us an access
        (26 tables: a tenth of a small batch's forward). A parametrized weight is no entry there; it is computed."""
        weights = []
        for table in self._modules.values():
            weight = table._parameters.get("weight")
            weights.append(cast(torch.Tensor, table.weight) if weight is None else weight)
        return weights

    def __iter__(self) -> Iterator[nn.EmbeddingBag]:
        return cast(Iterator[nn.EmbeddingBag], super().__iter__())  # every entry is a table

    def _first(self) -> nn.EmbeddingBag:
        return cast(nn.EmbeddingBag, self[0])  # every table agrees with it (checked at construction)

    @property
    def mode(self) -> str:
        return self._first().mode

    @property
    def include_last_offset(self) -> bool:
        return self._first().include_last_offset

    def forward(
        self,
        indices: Sequence[torch.Tensor],
        offsets: Sequence[torch.Tensor] | None = None,
        per_sample_weights: Sequence[torch.Tensor | None] | None = None,
        lengths: Sequence[torch.Tensor] | None = None,  # not keyword-only: torch 1.13's fx cannot trace those
        out: Sequence[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        return merged_embedding_bag(self._weights(), indices, offsets, per_sample_weights,
                                    lengths=lengths, mode=self.mode, include_last_offset=self.include_last_offset,
                                    sparse=self._first().sparse, out=out)  # fmt: skip

    def extra_repr(self) -> str:
        return f"tables={len(self)}, mode={self.mode!r}"

    def __repr__(self) -> str:
        # nn.ModuleList's own repr leaves extra_repr out (and folds repeated tables); the settings matter here.
        tables = "".join(f"\n  ({t}): {table!r}" for t, table in enumerate(self))
        return f"{type(self).__name__}({self.extra_repr()}{tables}\n)"
