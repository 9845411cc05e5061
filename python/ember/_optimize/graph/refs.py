"""Where a graph's tensor operands live, for the passes that give layers to ember's kernels.

Two kinds of graph:

- **Captured by ember** (symbolic trace, torch.export): a weight is a ``get_attr`` node (or a module call's own
  tensor), resolved to a :class:`~ember._optimize.inference.state.TensorRef` into the user's model, not into the
  GraphModule: both captures name a parameter by its path in the model (``layer1.0.conv1.weight``), and the
  GraphModule's copies of the modules on that path are placeholders that a parameter replaced in the model
  (``load_state_dict(assign=True)``) would leave stale. The fused node reads its tensors through the refs.
- **Handed over by dynamo** (``torch.compile(backend="ember")``): parameters and buffers are inputs of the graph,
  passed anew on every call. A fused node then takes its tensors as arguments of its call, and the refs (to the
  example inputs dynamo compiled with) only answer the passes' questions about shapes and dtypes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.inference.state import TensorRef


class TensorOperands:
    """Resolves a graph's tensor operands for the passes. ``examples``: the graph's inputs by placeholder name, for a
    graph whose fused nodes take their tensors as arguments (dynamo's); None for a graph captured by ember."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule, examples: dict[str, torch.Tensor] | None = None) -> None:
        self.roots = (model, gm)
        self.examples = examples
        self._held = nn.Module()  # the example inputs the refs of this graph point to (those used as operands)

    @property
    def passed_as_arguments(self) -> bool:
        """Whether fused nodes take their tensors as call arguments (dynamo's graphs) rather than read them."""
        return self.examples is not None

    def is_parameter(self, node: fx.Node) -> bool:
        """Whether a placeholder of a graph that passes its tensors is one of the model's parameters."""
        return self.examples is not None and isinstance(self.examples.get(node.name), nn.Parameter)

    def ref(self, value: Any) -> TensorRef | None:
        """Where the operand ``value`` lives: a ``get_attr`` node's tensor (in the model, else in the GraphModule for
        constants a capture made up), or a tensor input of a graph that passes its tensors; None otherwise."""
        if not isinstance(value, fx.Node):
            return None
        folded = self._folded(value)
        if folded is not None:
            return folded
        if value.op == "placeholder" and self.examples is not None:
            example = self.examples.get(value.name)
            if not isinstance(example, torch.Tensor):
                return None
            self._held.__dict__[value.name] = example
            return TensorRef(self._held, value.name)
        if value.op != "get_attr":
            return None
        prefix, _, name = str(value.target).rpartition(".")
        for root in self.roots:
            try:
                owner = root.get_submodule(prefix) if prefix else root
            except AttributeError:
                continue
            if isinstance(getattr(owner, name, None), torch.Tensor):
                return TensorRef(owner, name)
        return None

    def _folded(self, node: fx.Node) -> TensorRef | None:
        """A weight transform folded (fold_constants): its kept value, read as a parameter is; in a graph that
        passes its tensors, its value for the example inputs (for the passes' questions of shape and dtype)."""
        module = module_of(node, self.roots[1])
        if not isinstance(module, FoldedConstant):
            return None
        if self.examples is None:
            return TensorRef(module, "value")
        self._held.__dict__[node.name] = module.value
        return TensorRef(self._held, node.name)


def module_of(node: fx.Node, gm: fx.GraphModule) -> nn.Module | None:
    """The module a ``call_module`` node calls, or None."""
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def has_hooks(module: nn.Module | None) -> bool:
    """Whether ``module`` has forward hooks of its own, which a node fused away would no longer run."""
    return module is not None and bool(module._forward_hooks or module._forward_pre_hooks)


def with_operand(node: fx.Node, operand: fx.Node) -> None:
    """Makes ``operand`` (the tensor the epilogue adds or multiplies by) the fused ``node``'s second argument (its
    first is the layer's input; tensors passed as arguments, if any, follow)."""
    args = list(node.args)
    if len(args) == 1:
        args.append(operand)
    else:
        args[1] = operand
    node.args = tuple(args)
