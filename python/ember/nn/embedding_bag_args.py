"""A merged lookup's arguments as the user may give them (offsets, lengths or 2-D indices; per-sample weights or
None; out=) put into the operators' form (embedding_bag_ops.py), checked on the way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from ember._library import tracing
from ember._tensor import require_tensor


def check_out(out: object, weights: list[torch.Tensor], per_sample_weights: list[torch.Tensor]) -> list[Any]:
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


def normalize_call(
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
    """The operators' form of per_sample_weights: an empty 2-D tensor for a table that has none (see given), one
    shared by every such table of the call (each tensor made costs about a microsecond)."""
    if all(p is not None for p in per_sample_weights):
        return per_sample_weights  # type: ignore[return-value]
    none = weights[0].new_empty(0, 0)
    return [none if p is None else p for p in per_sample_weights]
