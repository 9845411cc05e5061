"""What the graph passes ask of a node while they match a pattern, one definition for every pass: the vocabulary's
call it makes (``call_if``), whether one node alone reads it (``only_reader``), whether a dimension is its last
(``is_last_dim``), whether it only reads a tensor's dtype (``is_dtype_read``), whether it only reshapes one
(``is_reshape``), the dimensions it permutes by (``permutation``), the shape the graph records for it
(``recorded_shape``) and the number it always computes (``scalar_constant``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._graph.ops import Call, call_of, movement_of

__all__ = [
    "call_if", "is_dtype_read", "is_last_dim", "is_reshape", "only_reader", "permutation", "recorded_shape",
    "scalar_constant",
]  # fmt: skip


def call_if(node: Any, root: nn.Module, *ops: str) -> Call | None:
    """The call ``node`` makes, when it is a node making one of the ``ops`` calls."""
    if not isinstance(node, fx.Node):
        return None
    call = call_of(node, root)
    return call if call is not None and call.op in ops else None


_RESHAPES = frozenset({"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"})


def is_reshape(node: Any) -> bool:
    """Whether ``node`` is ``x.view(shape)`` or ``x.reshape(shape)`` of one tensor, in any form (not a dtype view,
    which reinterprets the bits)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method":
        dtype_view = len(node.args) == 2 and isinstance(node.args[1], torch.dtype)
        return node.target in ("view", "reshape") and not node.kwargs and not dtype_view
    if node.op == "call_function":
        return node.target is torch.reshape or str(node.target) in _RESHAPES
    return False


def permutation(node: Any) -> tuple[int, ...] | None:
    """The dimensions a permute node permutes by (``x.permute(0, 3, 1, 2)``, ``torch.permute(x, [0, 3, 1, 2])``,
    ATen's), or None for any other node and for dimensions the graph does not hold as numbers."""
    if movement_of(node) != "permute":
        return None
    rest = node.args[1:] or (node.kwargs.get("dims"),)
    dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    return tuple(dims)


def recorded_shape(node: Any) -> tuple[Any, ...] | None:
    """The shape of ``node``'s value where the graph records one (torch.export's ``val``, dynamo's
    ``example_value``; symbolic tracing records none), else None. Its sizes may be symbolic."""
    if not isinstance(node, fx.Node):
        return None
    for key in ("val", "example_value"):
        shape = getattr(node.meta.get(key), "shape", None)
        if shape is not None:
            return tuple(shape)
    return None


def only_reader(node: Any, reader: fx.Node, dtype_reads: bool = False) -> bool:
    """Whether ``reader`` is the one node reading ``node``'s value; with ``dtype_reads``, reads of its dtype aside
    (the caller then checks where those go)."""
    if not isinstance(node, fx.Node) or reader not in node.users:
        return False
    return all(u is reader or (dtype_reads and is_dtype_read(u)) for u in node.users)


def is_dtype_read(node: Any, of: Any = None) -> bool:
    """Whether ``node`` reads a tensor's ``.dtype`` (``of``'s, when given)."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is getattr):
        return False
    return node.args[1:] == ("dtype",) and (of is None or node.args[0] is of)


def is_last_dim(dim: Any, node: Any) -> bool:
    """Whether ``dim`` names ``node``'s last dimension (-1, or its index where the graph records the rank)."""
    if dim == -1:
        return True
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(dim, int) and value is not None and hasattr(value, "dim") and dim == value.dim() - 1


# The steps a scalar constant may take from the graph's constants: copies, conversions and elementwise arithmetic
# (torch.export records ``torch.tensor(d).sqrt()`` as a lifted constant, its fresh copy, a detach and the arithmetic).
_SCALAR_STEPS = frozenset({
    "aten.lift_fresh_copy.default", "aten.detach_.default", "aten.detach.default", "aten.clone.default",
    "aten.to.dtype", "aten._to_copy.default", "aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor",
    "aten.sub.Tensor", "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default", "aten.pow.Tensor_Scalar",
})  # fmt: skip
_MAX_SCALAR_STEPS = 8


def scalar_constant(node: Any, root: nn.Module) -> float | None:
    """The number ``node`` computes on every call, where it is a one-element tensor computed from one-element
    tensors of ``root`` that are neither parameters nor buffers (the constants torch.export lifts out of a
    forward, which nothing updates) through at most a few of torch.export's copies, conversions and elementwise
    steps; else None. (A parameter or buffer may change after the graph is built: never read as a number.)"""
    if not isinstance(node, fx.Node):
        return None
    tensors = {name for name, _ in root.named_parameters()} | {name for name, _ in root.named_buffers()}
    order: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def visit(n: fx.Node) -> bool:
        if n in seen:
            return True
        seen.add(n)
        if len(seen) > _MAX_SCALAR_STEPS:
            return False
        if n.op == "get_attr":
            value = _attribute(root, str(n.target))
            if str(n.target) in tensors or not isinstance(value, torch.Tensor) or value.numel() != 1:
                return False
        elif n.op != "call_function" or str(n.target) not in _SCALAR_STEPS:
            return False
        if not all(visit(i) for i in n.all_input_nodes):
            return False
        order.append(n)
        return True

    if not visit(node):
        return None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in order:
        env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(env[node])
    with torch.no_grad():
        value = fx.GraphModule(root, graph)()
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.dtype == torch.bool:
        return None
    return float(value.item())


def _attribute(root: nn.Module, target: str) -> Any:
    found: Any = root
    for part in target.split("."):
        found = getattr(found, part, None)
    return found
