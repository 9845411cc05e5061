"""How a fused node learns the dtype of its result: by running the graph's own operations it replaced on operands cut
to one element (the dtype depends on the operands' dtypes and the autocast state, not on their sizes), once per
combination, as the nodes' plans remember it."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def one_element(t: torch.Tensor | None, keep: int | None = None) -> torch.Tensor | None:
    """``t`` cut to one element along every dimension but ``keep`` (a row's features; None: every dimension)."""
    if t is None:
        return t
    return t[tuple(slice(None) if d == keep else slice(0, 1) for d in range(t.dim()))]


def result_dtype(operations: Callable[..., Any], *operands: torch.Tensor | None) -> torch.dtype | None:
    """The dtype of what ``operations`` return for these operands now, where it is one of ember's kernel dtypes;
    None where it is another, or where torch refuses the operands (the user's own call then says so)."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what torch says of these dtypes, it says on the user's own call
            result = operations(*operands)
    except RuntimeError:
        return None
    if not isinstance(result, torch.Tensor) or result.dtype not in KERNEL_DTYPES:
        return None
    dtype: torch.dtype = result.dtype
    return dtype
