"""``ember.llm.KVCache``: the key/value cache of a generation, owned by ember (a paged cache in C++,
csrc/kv_cache/), in the shape Hugging Face's ``generate`` and a model's forward expect of a ``Cache``.

Hugging Face's ``DynamicCache`` concatenates each new token's keys onto tensors of every past token (a copy of the
whole cache per layer per token) and pads a batch to its longest sequence; ember's keeps each sequence's tokens in
blocks of a pool that the model's generations share, writes a token once, keeps no padding (a left-padded prompt's
pad tokens are never stored), and shares blocks between beams.

What it answers to Hugging Face: ``get_seq_length()`` counts positions as Hugging Face does (padding included), the
mask sizes follow from it, and beam search's ``reorder_cache``, assisted decoding's ``crop`` and the batch
selections and repeats of contrastive search act on the block tables. It does not hand out key/value tensors
(``update``): only ember's forward reads it.

The class derives from ``transformers.Cache`` where transformers is installed, so the isinstance checks of
``generate`` take it as a cache; it is made on first use, so importing ember does not import transformers.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ember import _C


class KVCacheBase:
    """The cache's behaviour; :func:`kv_cache_class` gives the class to instantiate."""

    def __init__(self, pool: _C.KVCachePool) -> None:
        self.pool = pool
        self.paged = _C.PagedKVCache(pool)
        self.seen = 0  # positions of every sequence so far, as Hugging Face counts them (padding included)
        # [sequences, seen] bool: which positions each sequence stored (False: padding). None while all are True.
        self.stored: torch.Tensor | None = None
        self.layers: list[Any] = []  # (transformers.Cache's per-layer list: ember's cache has none)
        self._is_user_defined = False

    # --- what ember's forward calls --------------------------------------------------------------------------------

    @property
    def sequences(self) -> int:
        return int(self.paged.sequences)

    def begin(self, batch: int, keep: torch.Tensor | None, tokens: int) -> list[int]:
        """Starts a forward of ``tokens`` positions for each of ``batch`` sequences, storing those where ``keep``
        ([batch, tokens] bool, or None for all); returns each sequence's stored tokens before it."""
        if self.sequences == 0 and self.seen == 0:
            self.paged.set_sequences(batch)
        if batch != self.sequences:
            raise ValueError(
                f"ember.llm.KVCache: this cache holds {self.sequences} sequences, the forward was given {batch}"
            )
        before = self.paged.lengths()
        counts = [tokens] * batch if keep is None else keep.sum(dim=1).tolist()
        self.paged.begin(counts)
        return before

    def commit(self, keep: torch.Tensor | None, tokens: int) -> None:
        self.paged.commit()
        if keep is not None or self.stored is not None:
            step = keep if keep is not None else torch.ones(self.sequences, tokens, dtype=torch.bool)
            past = self.stored if self.stored is not None else torch.ones(self.sequences, self.seen, dtype=torch.bool)
            self.stored = torch.cat([past, step], dim=1)
        self.seen += tokens

    def cancel(self) -> None:
        self.paged.cancel()

    # --- transformers.Cache ----------------------------------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: Any, layer_idx: int = 0) -> tuple[int, int]:
        length = query_length if isinstance(query_length, int) else int(query_length.shape[0])
        return self.seen + length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # grows as it is used

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        rows = [int(i) for i in beam_idx.tolist()]
        self.paged.reorder(rows)
        if self.stored is not None:
            self.stored = self.stored[beam_idx.cpu()]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.reorder_cache(torch.arange(self.sequences).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        """Keeps the first ``max_length`` positions (a negative value: removes that many from the end)."""
        keep = self.seen + max_length if max_length < 0 else min(max_length, self.seen)
        keep = max(keep, 0)
        if keep == self.seen:
            return
        if self.stored is None:
            self.paged.truncate([keep] * self.sequences)
        else:
            self.paged.truncate(self.stored[:, :keep].sum(dim=1).tolist())
            self.stored = self.stored[:, :keep]
        self.seen = keep

    def reset(self) -> None:
        self.paged.clear()
        self.seen = 0
        self.stored = None

    def update(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ember.llm.KVCache holds keys and values for ember's forward only; a model running its own attention "
            "(Hugging Face's forward, e.g. with output_attentions=True) needs transformers' DynamicCache"
        )

    def to_legacy_cache(self) -> Any:
        raise NotImplementedError("ember.llm.KVCache has no legacy (tuple) form")

    def __len__(self) -> int:
        return int(self.pool.layers)

    def __repr__(self) -> str:
        return (
            f"ember.llm.KVCache(sequences={self.sequences}, positions={self.seen}, "
            f"blocks={self.paged.blocks_held()}, bytes={self.paged.bytes_held()})"
        )

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.sequences > 0

    @property
    def is_croppable(self) -> bool:
        return True

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * int(self.pool.layers)

    @property
    def batch_size(self) -> int:
        return self.sequences

    @property
    def max_batch_size(self) -> int:
        return self.sequences

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this cache holds."""
        return int(self.paged.bytes_held())


@functools.cache
def kv_cache_class() -> type[KVCacheBase]:
    """KVCacheBase as a ``transformers.Cache`` where transformers is installed (generate's isinstance checks), else
    as it is (a plain-torch decoder's cache)."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return type("KVCache", (KVCacheBase,), {"__module__": "ember.llm"})
    return type("KVCache", (KVCacheBase, Cache), {"__module__": "ember.llm"})


def new_cache(pool: _C.KVCachePool) -> KVCacheBase:
    return kv_cache_class()(pool)
