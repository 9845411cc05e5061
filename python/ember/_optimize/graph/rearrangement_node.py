"""The module graph mode puts in place of a chain of data-movement operations (views, permutes, rolls, slices and the
copies between them): the same result as one gather of the input's rows.

A chain that only moves elements gives an output whose every element is some element of its input, at a place that
depends on the shapes alone. Run once on an index tensor (``arange`` of the input's shape), the chain says which
input element each output element is; where every output row of the input's last dimension is a whole input row
(the chain moves rows of channels, as a window partition or a roll over the spatial dimensions does), the call is
``x.view(-1, width).index_select(0, rows)``: one pass over memory, on every thread, where the chain's own operations
made one copy per roll dimension and one per contiguous permute (Swin's shifted window partition: a roll over two
dimensions, then a permuted copy).

The plan (the row index, the output's shape) is made per input shape and per value of the chain's size arguments,
and remembered (a few of them: a model runs one or two shapes at a time). The node keeps the chain as a small
GraphModule (``original``) and runs it whenever the gather does not take a call: an input that is not contiguous,
autograd, a chain that moves parts of rows, or one whose result the index run shows to be a view of the input (no
copy to save).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._optimize.graph.fast_calls import RECORDING

# The plans a node keeps: the input shapes (and size arguments) of one model's calls.
_PLANS = 8


class _Plan:
    """The gather for one input signature: the input's row width, the rows to read and the output's shape."""

    __slots__ = ("rows", "shape", "width")

    def __init__(self, width: int, rows: torch.Tensor, shape: tuple[int, ...]) -> None:
        self.width, self.rows, self.shape = width, rows, shape


class FusedRearrangement(nn.Module):
    """``original(x, *sizes)`` (a chain of data-movement operations) as one gather of ``x``'s rows."""

    def __init__(self, original: fx.GraphModule, origin: str) -> None:
        super().__init__()
        self.original = original  # (x, *sizes) -> the chain's result
        self.origin = origin
        self._plans: dict[tuple[Any, ...], _Plan | None] = {}

    def forward(self, x: Any, *sizes: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.is_contiguous() and not _records_autograd(x):
            key = (tuple(x.shape), *sizes)
            plans = self._plans
            if key in plans:
                plan = plans[key]
            else:
                plan = self._plan(x, sizes)
                if len(plans) >= _PLANS:
                    del plans[next(iter(plans))]
                plans[key] = plan
            if plan is not None:
                rows = x.view(-1, plan.width)
                out = rows.index_select(0, plan.rows)
                recorder = RECORDING.active
                if recorder is not None:
                    recorder.gather_rows(rows, plan.rows, out)
                return out.view(plan.shape)
        return self.original(x, *sizes)

    def _plan(self, x: torch.Tensor, sizes: tuple[Any, ...]) -> _Plan | None:
        """The gather that gives the chain's result for inputs of ``x``'s shape, or None where the chain moves parts
        of rows, or copies nothing."""
        width = x.shape[-1]
        if width == 0 or x.numel() == 0:
            return None
        with torch.no_grad():
            index = torch.arange(x.numel()).view(x.shape)
            try:
                moved = self.original(index, *sizes)
            except (RuntimeError, ValueError, IndexError, TypeError):
                return None  # (the chain refuses these shapes: the call runs it and raises as the graph would)
            if not isinstance(moved, torch.Tensor) or moved.dtype != index.dtype or moved.numel() % width:
                return None
            if moved is index or moved._base is index:
                return None  # a view of the input: nothing copied, nothing to save
            flat = moved.reshape(-1, width)
            first = flat[:, :1]
            if bool((first % width != 0).any()) or not torch.equal(flat - first, torch.arange(width).expand_as(flat)):
                return None  # parts of rows moved: not a gather of whole rows
        return _Plan(width, (first.reshape(-1) // width).contiguous(), tuple(moved.shape))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plans": {}}  # (made again on the first calls of a copy)

    def extra_repr(self) -> str:
        return f"{self.origin}: one gather of rows"


def _records_autograd(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad
