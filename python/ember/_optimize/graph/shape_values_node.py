"""The module graph mode puts in place of the values a forward computes from its inputs' sizes alone: masks built from
positions (``arange(n) >= 0``, a causal triangle, Swin's shifted-window masks, the gathered mask of
:mod:`attention_mask`), position ids, zeros of a shape. Each is the same on every call with inputs of the same sizes,
so it is computed once per input signature and kept (:mod:`shape_values` says which values qualify).

The key of a call: each input's shape, strides, dtype and device (the values read only those), each kept tensor of
the model's it reads by identity and version counter (a parameter changed in place or replaced computes anew), and
the autocast and grad state the operations ran under. A few signatures are kept (a model serves a few input sizes
at a time).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._optimize.inference.common import cpu_autocast_dtype

# Input signatures kept per module: a batch size or two and a sequence length or two at a time.
_SIGNATURES = 8


class ShapeValues(nn.Module):
    """``expression(*leaves)`` (a tuple of values), computed once per signature of the leaves. ``inputs`` says
    which leaves are the forward's inputs (read for their sizes, dtypes and devices only); the others are tensors
    of the model's (read by identity and version)."""

    def __init__(self, expression: fx.GraphModule, inputs: tuple[bool, ...], origin: str) -> None:
        super().__init__()
        self.expression = expression
        self.inputs = inputs
        self.origin = origin  # the graph nodes it replaced, for repr
        self.kept: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}

    def forward(self, *leaves: Any) -> Any:
        key = self._key(leaves)
        if key is None:
            return self.expression(*leaves)
        found = self.kept.get(key)
        if found is not None:
            return found[0]
        with torch.inference_mode(False), torch.no_grad():
            # A value kept across calls must be an ordinary tensor: one made under inference mode could not be read
            # by a later call with autograd on.
            values = self.expression(*leaves)
        if len(self.kept) >= _SIGNATURES:
            del self.kept[next(iter(self.kept))]
        # The model's tensors are held with the values, so that no other tensor can take their identity.
        self.kept[key] = (values, tuple(leaf for leaf, is_input in zip(leaves, self.inputs) if not is_input))
        return values

    def _key(self, leaves: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The call's signature, or None where it cannot be told (a value then is computed, not kept)."""
        key: list[Any] = [cpu_autocast_dtype(), torch.is_grad_enabled()]
        for leaf, is_input in zip(leaves, self.inputs):
            if not isinstance(leaf, torch.Tensor):
                if not isinstance(leaf, (int, float, bool, str, type(None), torch.dtype, torch.device)):
                    return None
                key.append(leaf)
            elif is_input:
                key.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
            else:
                if leaf.requires_grad and torch.is_grad_enabled():
                    return None  # recorded for autograd, as the forward would record it
                if leaf.is_inference():
                    return None  # no version counter: a change in place could not be seen
                key.append((id(leaf), leaf._version))
        return tuple(key)

    def __getstate__(self) -> dict[str, Any]:
        # The kept values are a cache: a copy or a pickle of the model computes its own.
        return {**self.__dict__, "kept": {}}

    def extra_repr(self) -> str:
        return self.origin
