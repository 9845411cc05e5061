"""The forward of a model optimized in graph mode: the captured graph, rewritten by the passes, installed on the
instance (``model.forward``) so that the model keeps its class, its module tree and its ``state_dict``; the
GraphModule is held by this object and is no submodule of the model.

The graph runs in eval mode. In train mode, while a hook the graph would skip is registered on a module it fused
away, and for inputs the graph was not captured for (another structure of arguments; a size torch.export fixed),
the forward the module-level rewrite gave the model (or its class's) runs instead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import fx, nn

from ember._optimize.graph.fast_calls import GraphGuard, bind_called_modules, checked
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.inference.common import hooks_would_be_skipped


class GraphForward:
    """``model.forward`` of a graph-mode model: ``graph`` where it applies, else the class's forward."""

    _ember_forward = True

    def __init__(
        self,
        model: nn.Module,
        graph: fx.GraphModule,
        path: str,
        fused_modules: list[nn.Module],
        fallback: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        self.fallback = fallback  # a container's fused forward from the module-level rewrite, if it gave one
        self.graph = graph
        self.path = path
        # The model's modules whose calls the graph replaced: a hook registered on one later must still run.
        self.fused_modules = tuple(fused_modules)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        if model.training or hooks_would_be_skipped(self.fused_modules):
            return self.without_graph(*args, **kwargs)
        try:
            with checked(self.guard()):
                return self.graph(*args, **kwargs)
        except Exception:
            # Inputs the graph was not captured for (torch.export's guards check sizes and argument structure
            # before anything is computed): the model's own forward runs them, and raises what it raises.
            return self.without_graph(*args, **kwargs)

    def guard(self) -> GraphGuard:
        """The checks this graph's forward makes once for all its fused layers (made on the first call, which binds
        the modules the graph calls as well: a copy of this forward makes its own, over its own graph)."""
        guard = self.__dict__.get("_guard")
        if guard is None:
            guard = GraphGuard(m.state for m in self.graph.modules() if isinstance(m, FusedLayer))
            bind_called_modules(self.graph)
            self._guard = guard
        return guard

    def without_graph(self, *args: Any, **kwargs: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args, **kwargs)
        return type(self.model).forward(self.model, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "_guard"}  # made again on first call

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphForward:
        # Through the GraphModule's pickling form, whose parts deep-copy with this copy's memo: torch 1.13's own
        # GraphModule.__deepcopy__ starts a memo of its own, so the model its fused nodes point into was copied again,
        # and again (the model holds this forward), until the recursion limit.
        copied = GraphForward.__new__(GraphForward)
        memo[id(self)] = copied
        rebuild, args = self.graph.__reduce__()[:2]
        rest = {name: value for name, value in self.__dict__.items() if name not in ("graph", "_guard")}
        copied.__dict__.update(copy.deepcopy(rest, memo))
        copied.graph = rebuild(*copy.deepcopy(args, memo))
        return copied

    def __repr__(self) -> str:
        return f"GraphForward({type(self.model).__name__}, captured by {self.path})"
