"""The forward of a model optimized in graph mode: the captured graph, rewritten by the passes, installed on the
instance (``model.forward``) so that the model keeps its class, its module tree and its ``state_dict``; the
GraphModule is held by this object and is no submodule of the model.

The graph runs in eval mode. In train mode, while a hook the graph would skip is registered on a module it fused
away, and for inputs the graph was not captured for (another structure of arguments; a size torch.export fixed),
the forward the module-level rewrite gave the model (or its class's) runs instead.
"""

from __future__ import annotations

import copy
import inspect
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
        form: tuple[int, frozenset[str]] | None = None,
    ) -> None:
        self.model = model
        self.fallback = fallback  # a container's fused forward from the module-level rewrite, if it gave one
        self.graph = graph
        self.path = path
        # How the graph takes its inputs where it insists on one form (torch.export's graphs check their call against
        # the sample's): how many positionally, and which by keyword. A call in another form is bound to the model's
        # forward and passed on in this one; else a sample given as {"x": t} sent every model(t) to the fallback.
        self.form = form
        # The model's modules whose calls the graph replaced: a hook registered on one later must still run.
        self.fused_modules = tuple(fused_modules)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        if model.training or hooks_would_be_skipped(self.fused_modules):
            return self.without_graph(*args, **kwargs)
        form = self.form
        if form is not None and (len(args) != form[0] or kwargs.keys() != form[1]):
            args, kwargs = self._in_captured_form(args, kwargs)
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

    def _in_captured_form(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's inputs bound to the model's forward and laid out as the graph takes them; as they are where
        they do not bind, or where the graph has no place for one of them (its check then sends the call to the
        model's own forward)."""
        assert self.form is not None
        signature = self.__dict__.get("_signature")
        if signature is None:
            signature = self._signature = inspect.signature(type(self.model).forward)
        parameters = list(signature.parameters.values())[1:]  # (after self)
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            return args, kwargs
        try:
            bound = signature.bind(self.model, *args, **kwargs).arguments
        except TypeError:
            return args, kwargs
        positional = [p.name for p in parameters[: self.form[0]]]
        keywords = self.form[1]
        given = bound.keys() - {next(iter(signature.parameters))}
        if given != set(positional) | keywords:
            return args, kwargs
        return tuple(bound[name] for name in positional), {name: bound[name] for name in keywords}

    def without_graph(self, *args: Any, **kwargs: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args, **kwargs)
        return type(self.model).forward(self.model, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # (The guard and the forward's signature are made again on first use.)
        return {name: value for name, value in self.__dict__.items() if name not in ("_guard", "_signature")}

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphForward:
        # Through the GraphModule's pickling form, whose parts deep-copy with this copy's memo: torch 1.13's own
        # GraphModule.__deepcopy__ starts a memo of its own, so the model its fused nodes point into was copied again,
        # and again (the model holds this forward), until the recursion limit.
        copied = GraphForward.__new__(GraphForward)
        memo[id(self)] = copied
        rebuild, args = self.graph.__reduce__()[:2]
        rest = {name: value for name, value in self.__dict__.items() if name not in ("graph", "_guard", "_signature")}
        copied.__dict__.update(copy.deepcopy(rest, memo))
        copied.graph = rebuild(*copy.deepcopy(args, memo))
        return copied

    def __repr__(self) -> str:
        return f"GraphForward({type(self.model).__name__}, captured by {self.path})"
