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

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn

from ember.nn.embedding_bag_args import check_out, normalize_call
from ember.nn.embedding_bag_ops import run_lookup

__all__ = ["MergedEmbeddingBag", "merged_embedding_bag"]

_MODES = ("sum", "mean")


# --- the functional form -------------------------------------------------------------------------------------------


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
    flat, starts, psw = normalize_call(weights, indices, offsets, per_sample_weights, lengths, include_last_offset)
    if out is not None:
        out = check_out(out, weights, psw)
    return run_lookup(weights, flat, starts, psw, mode, include_last_offset, sparse, out)


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
