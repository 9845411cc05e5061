"""Two masks an attention node is handed as tensors and can do without: the causal triangle and a mask that keeps
every score.

Hugging Face's decoders (Llama, Mistral, Qwen2, and the decoders of T5, BART and Whisper) build the causal mask as a
tensor, a bool one (True: keep) or an additive float one (0, and -inf or the dtype's lowest value), and pass it to
the attention; the graph computes it from position arithmetic, so no pass can tell from the graph that it is the
triangle. Handed that mask, the kernel reads every key for every query, masked or not; told ``causal``, it stops
each block of queries at its last query's key, half the scores of a square attention. Their encoders, exported with
no padding to tell (ViT, DeiT, a BERT called without ``attention_mask``), build a mask that keeps everything
(``arange(n) >= 0`` expanded to ``[batch, 1, n, n]``): the kernel then reads it for every score (in the AMX kernel
one element a key, as its keys have stride 0) and loses the blocks it knows unmasked; without it, ViT-B/16's
attention at batch 4 ran 1.5x faster on a 2-core Sapphire Rapids.

:func:`recognize` tells which a mask is: "keeps everything" from one element per distinct value (the mask's
broadcast dimensions, stride 0, read once), the triangle by ``torch.equal`` against a cached reference (a few
microseconds for a 128 x 128 mask). Within one guarded forward (fast_calls.CHECKED) it answers again for the same
mask at once, as every layer of a model is handed the same one (a few masks are remembered: an encoder-decoder's
decoder alternates its causal mask and the cross-attention's).

The kernel gives the same result either way: a masked score adds an exact zero to its row's sums, which a skipped
one does not add, and a causal row always keeps its first key; a kept score plus the mask's zero is the score.
"""

from __future__ import annotations

import enum
import threading

import torch

from ember._optimize.graph.fast_calls import CHECKED


class KnownMask(enum.Enum):
    """What a mask tensor means to the kernel."""

    NOTHING = "keeps every score"  # the call runs without the mask
    CAUSAL = "the causal triangle"  # the call runs with ``causal`` instead
    OTHER = "another mask"  # the kernel reads it


_REFERENCE_SIZES = 8  # the triangles kept (per size and dtype): a model uses one or two sequence lengths at a time


# Masks whose verdicts one guarded forward keeps: an encoder-decoder's decoder alternates two (its own causal one and
# the cross-attention's), and its encoder has a third.
_MEMO_MASKS = 4


class _Memo(threading.local):
    """The verdicts of the calling thread's current guarded forward, with the masks they are about (held, so that
    their memory cannot become another mask's while a verdict stands): ``(mask, bool_mask_keeps, verdict)``."""

    epoch = 0
    entries: list[tuple[torch.Tensor, bool, KnownMask]]

    def __init__(self) -> None:
        self.entries = []


_MEMO = _Memo()
_references: dict[tuple[int, torch.dtype], tuple[torch.Tensor, ...]] = {}


def recognize(mask: torch.Tensor, bool_mask_keeps: bool) -> KnownMask:
    """What ``mask`` (``[..., queries, keys]``, broadcast over its leading dimensions) means to the kernel. A bool
    mask keeps a score where True (``bool_mask_keeps``; where False the graph adds it to the scores as numbers, and it
    is OTHER); a float one is added. NOTHING: every score kept (all True, or all zeros). CAUSAL: exactly the top-left
    causal triangle of a square attention, key j kept for query i iff j <= i (a float mask 0 on and below the
    diagonal and, above it, all -inf or all the dtype's lowest value: masked scores that vanish from the softmax)."""
    epoch = CHECKED.epoch
    memo = _MEMO
    if epoch:
        if memo.epoch != epoch:
            memo.epoch, memo.entries = epoch, []
        for held, keeps, verdict in memo.entries:
            if keeps == bool_mask_keeps and _same_tensor(held, mask):
                return verdict
    verdict = _compare(mask, bool_mask_keeps)
    if epoch:
        if len(memo.entries) == _MEMO_MASKS:
            del memo.entries[0]
        memo.entries.append((mask, bool_mask_keeps, verdict))
    return verdict


def _same_tensor(held: torch.Tensor, mask: torch.Tensor) -> bool:
    """The same elements: the same object, or a view of the same memory with the same layout (a decoder layer may
    slice the mask it is handed). ``held`` is alive, so its memory is no other tensor's."""
    if held is mask:
        return True
    return (
        held.data_ptr() == mask.data_ptr()
        and held.dtype == mask.dtype
        and held.shape == mask.shape
        and held.stride() == mask.stride()
    )


def _compare(mask: torch.Tensor, bool_mask_keeps: bool) -> KnownMask:
    if mask.dtype == torch.bool:
        if not bool_mask_keeps:
            return KnownMask.OTHER
    elif not mask.dtype.is_floating_point:
        return KnownMask.OTHER
    if mask.device.type != "cpu" or mask.dim() == 0:
        return KnownMask.OTHER
    if _keeps_everything(mask):
        return KnownMask.NOTHING
    if mask.dim() < 2 or mask.shape[-1] != mask.shape[-2] or mask.shape[-1] < 2:
        return KnownMask.OTHER
    triangles = _triangles(mask.shape[-1], mask.dtype)
    if any(torch.equal(mask, reference.expand(mask.shape)) for reference in triangles):
        return KnownMask.CAUSAL
    return KnownMask.OTHER


def _keeps_everything(mask: torch.Tensor) -> bool:
    """All True (bool) or all zeros (float; NaN is not), read once per distinct element: a dimension the mask
    broadcasts by stride 0 (``expand``) is read at its first index only."""
    index = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in mask.stride())
    distinct = mask[index]
    if mask.dtype == torch.bool:
        return bool(distinct.all())
    return not bool(distinct.any())


def _triangles(size: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The causal masks of one size and dtype: the bool triangle, or the additive ones (-inf, the dtype's lowest)."""
    key = (size, dtype)
    found = _references.get(key)
    if found is None:
        keep = torch.ones(size, size, dtype=torch.bool).tril_()
        if dtype == torch.bool:
            found = (keep,)
        else:
            zeros = torch.zeros((), dtype=dtype)
            found = tuple(
                torch.where(keep, zeros, torch.full((), masked, dtype=dtype))
                for masked in (float("-inf"), torch.finfo(dtype).min)
            )
        if len(_references) >= _REFERENCE_SIZES:
            _references.pop(next(iter(_references)))
        _references[key] = found
    return found
