"""Repeated computations shared: a pure, deterministic operation with the same operation, operands and attributes
as one before it reads the earlier one's result instead of computing it again.

Hugging Face's models compute some values once per layer from the same inputs. T5's attention (transformers 5)
combines the shared position bias with the mask in every layer, ``torch.where(mask, bias, finfo.min)``: 18 identical
``[batch, heads, L, L]`` tensors a forward in T5-small, one per attention. Shared, the attention nodes also get the
same mask tensor, which their mask check (``known_masks.py``) then compares once.

Sound when the two computations see the same values and neither result is written afterwards:

- both are pure (:mod:`purity`) and deterministic (no random or uninitialized result);
- no operation that is not known pure (an in-place write, an unknown call) lies between them: the key carries a count
  of such operations, so two computations with one between them never match;
- no in-place write reaches either result's memory, through any view: values that may share memory are grouped
  (an ATen overload says which arguments its result aliases; any other call is taken to alias every input, unless it
  is an operation of the vocabulary that makes a new tensor), and a group something writes is never shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from ember import _compat
from ember._graph.ops import ACTIVATIONS, call_of, writes_in_place
from ember._optimize.graph.purity import FUSED, is_pure
from ember._optimize.graph.refs import module_of

# Vocabulary operations (ember._graph.ops) whose result is a new tensor, never a view of an operand.
_NEW_TENSOR_OPS = ACTIVATIONS | {
    "linear", "conv", "conv_transpose", "matmul", "addmm", "batch_norm", "layer_norm", "rms_norm", "pow", "mean",
    "rsqrt", "scaled_dot_product_attention", "softmax", "div", "neg", "cat", "add", "mul",
}  # fmt: skip
# Names of operations whose result is random or uninitialized: never the same twice.
_NONDETERMINISTIC = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson", "empty",
                     "exponential", "cauchy", "geometric", "seed")  # fmt: skip


class _Unhashable(Exception):
    """An operand the key cannot hold (a tensor constant, an object of unknown equality)."""


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Shares every repeated computation the module's docstring allows; returns how many nodes it removed."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    impure = {n for n in calls if not is_pure(gm, n)}  # (asked once: call_of binds each node's operands)
    written = _written_groups(gm, impure)
    seen: dict[tuple[Any, ...], fx.Node] = {}
    effects = 0  # operations not known pure so far
    shared = 0
    for node in calls:
        if node in impure:
            effects += 1
            continue
        if node.op not in ("call_function", "call_method") or not _deterministic(node.target):
            continue
        if written.writes(node):
            continue
        try:
            key = (node.op, node.target, _frozen(node.args), _frozen(node.kwargs), effects)
        except _Unhashable:
            continue
        kept = seen.setdefault(key, node)
        if kept is not node:
            node.replace_all_uses_with(kept)
            gm.graph.erase_node(node)
            shared += 1
    gm.recompile()
    return shared


def _deterministic(target: object) -> bool:
    name = (target if isinstance(target, str) else getattr(target, "__name__", str(target))).lower()
    return not any(word in name for word in _NONDETERMINISTIC)


class _Groups:
    """Values that may share memory, as a union-find over nodes, and which groups an in-place write reaches."""

    def __init__(self) -> None:
        self._parent: dict[fx.Node, fx.Node] = {}
        self._written: set[fx.Node] = set()
        self._roots_written: set[fx.Node] = set()  # (made by seal(), once every join is done)

    def root(self, node: fx.Node) -> fx.Node:
        parent = self._parent.setdefault(node, node)
        while parent is not node:
            grand = self._parent[parent]
            self._parent[node] = grand  # (path halving)
            node, parent = parent, grand
        return node

    def join(self, a: fx.Node, b: fx.Node) -> None:
        self._parent[self.root(a)] = self.root(b)

    def mark_written(self, nodes: Iterable[fx.Node]) -> None:
        self._written.update(nodes)

    def writes(self, node: fx.Node) -> bool:
        """Whether an in-place write reaches ``node``'s memory."""
        return self.root(node) in self._roots_written

    def seal(self) -> None:
        self._roots_written = {self.root(n) for n in self._written}


def _written_groups(gm: fx.GraphModule, impure: set[fx.Node]) -> _Groups:
    groups = _Groups()
    for node in gm.graph.nodes:
        for operand in _aliased_operands(gm, node):
            groups.join(node, operand)
        if node in impure:
            # An in-place write (or an unknown call, which may write any tensor it is given) reaches its operands.
            groups.mark_written(node.all_input_nodes)
    groups.seal()
    return groups


def _aliased_operands(gm: fx.GraphModule, node: fx.Node) -> list[fx.Node]:
    """The operands whose memory ``node``'s result may share."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return []
    operands = node.all_input_nodes
    schema = _compat.operator_schema(node.target) if node.op == "call_function" else None
    if schema is not None:  # an ATen overload's schema marks a result that aliases an argument (a view)
        aliases = any(r.alias_info is not None for r in schema.returns) or writes_in_place(node.target)
        return operands if aliases else []
    if node.op == "call_module" and isinstance(module_of(node, gm), FUSED):
        return []  # ember's fused nodes write new tensors
    call = call_of(node, gm)
    if call is not None and call.op in _NEW_TENSOR_OPS and not call.operands.get("inplace"):
        return []
    return operands


def _frozen(value: Any) -> Any:
    """``value`` (an argument of a node) as a hashable key: equal keys for operands that compute the same."""
    if isinstance(value, fx.Node):
        return ("node", value)
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device, torch.memory_format,
                                           torch.layout)):  # fmt: skip
        return (type(value), value)
    if isinstance(value, (float, complex)):
        return (type(value), repr(value))  # (-0.0 and 0.0 differ; 1 and 1.0 and True differ by type)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, slice):
        return (slice, _frozen(value.start), _frozen(value.stop), _frozen(value.step))
    if value is Ellipsis:
        return (type(value),)
    raise _Unhashable
