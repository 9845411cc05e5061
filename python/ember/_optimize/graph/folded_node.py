"""The module graph mode puts in place of a weight transform: a value the forward computes from the model's own
tensors alone (``self.weight.t()``, a weight norm's ``g * v / ||v||``, Swin's relative-position bias gathered from
its table), kept from one call to the next and computed again only when one of the tensors it reads changes.

It keeps the operations it replaced as a GraphModule of its source tensors (``expression``), and watches the
sources as a layer's weight cache does (:class:`~ember._optimize.inference.state.CachedKernel`): a parameter
replaced (``load_state_dict(assign=True)``) or changed in place (its version counter) makes the next call compute
the value anew. The model's parameters stay the source of truth and the value is never in its ``state_dict``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._optimize.inference.state import CachedKernel, TensorRef


class FoldedConstant(nn.Module):
    """``expression(*sources)``, computed once per value of the sources. ``sources`` says where they live; a graph
    that passes the model's tensors as its inputs (dynamo's) passes them to the call as well."""

    def __init__(self, expression: fx.GraphModule, sources: tuple[TensorRef, ...], origin: str) -> None:
        super().__init__()
        self.expression = expression
        self.sources = sources
        self.origin = origin  # the graph node it replaced, for repr
        self.cache = CachedKernel()

    def forward(self, *passed: torch.Tensor) -> Any:
        return self.evaluate(passed if passed else self.read_sources())

    @property
    def value(self) -> Any:
        """The value for the sources where they live now (what a layer reading it as its weight reads)."""
        return self.evaluate(self.read_sources())

    def read_sources(self) -> tuple[torch.Tensor, ...]:
        return tuple(ref.get() for ref in self.sources)  # type: ignore[misc]

    def evaluate(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._compute(tensors)  # recorded for autograd, as the forward would record it; not kept
        cache = self.cache
        cache.track(tensors)
        value = cache.kernel
        if value is None:
            value = cache.build(lambda: self._kept(tensors))
        return value

    def _kept(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        # A value kept across calls must be an ordinary tensor: one made under inference mode could not be read by
        # a later call with autograd on.
        with torch.inference_mode(False), torch.no_grad():
            return self._compute(tensors)

    def _compute(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        # The transforms folded are not ones autocast changes (folding admits none of its operations): computed with
        # it off, the value does not depend on the caller's autocast state, which the cache does not watch.
        with torch.autocast("cpu", enabled=False):
            return self.expression(*tensors)

    def extra_repr(self) -> str:
        return f"{self.origin}, from {', '.join(ref.name for ref in self.sources)}"
