"""Values computed from the inputs' sizes alone, kept per input signature instead of computed on every call.

A forward builds tensors that depend on its inputs' shapes and dtypes but not on their numbers: an exported
encoder's mask from ``arange(n)``, a decoder's causal triangle from positions, Swin's shifted-window masks (zeros,
slices filled with window numbers, a difference of two views, a masked fill: two dozen small operations in each of
its blocks) and the mask :mod:`attention_mask` gathers from them onto zeros of the scores' shape, an fp32 tensor
as large as the scores, added anew in every shifted block (on the 2-core Sapphire Rapids those adds alone were a
fifth of Swin-T's forward at batch 1). Each such value (a *shape value*) is computed by a
:class:`~ember._optimize.graph.shape_values_node.ShapeValues` node, once per signature of what it reads.

A node is a shape value where it reads only: sizes, strides, dtypes and devices of any tensor (``aten.sym_size``,
``x.size(d)``, ``new_zeros``, ``zeros_like``, :func:`attention_mask.scores_zeros`), the model's tensors and kept
weight transforms (their identity and version are part of the key), literals, and other shape values; and where its
operation is deterministic (no random numbers, no effect beyond writing a shape value in place). The values kept
are the tensors among them that something else reads (the frontier); scalars stay computed where they were.

Not kept: a value the graph returns (its caller may write it), one that anything else writes in place (through any
view), and one that a shape value's in-place write reaches only after something else has read it. Where the
graph's other operations write a shape value in place at all, the pass keeps nothing.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from ember import _compat
from ember._graph.ops import writes_in_place
from ember._optimize.graph.attention_mask import scores_zeros
from ember._optimize.graph.fold_constants import extract_subgraph, foldable, is_view
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.refs import module_of
from ember._optimize.graph.shape_values_node import ShapeValues

# ATen operators that read only the sizes, strides, dtype and device of their tensor operands.
_ATEN_METADATA = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "new_zeros", "new_ones", "new_full",
                  "zeros_like", "ones_like", "full_like"}  # fmt: skip
_METHOD_METADATA = {"size", "dim", "new_zeros", "new_ones", "new_full"}
_ATTRIBUTE_METADATA = {"shape", "dtype", "device", "ndim"}


def cache_shape_values(gm: fx.GraphModule) -> int:
    """Replaces the tensors computed from the inputs' sizes alone by values kept per input signature; returns how
    many nodes now read a kept value."""
    shape, readers_of = _shape_values(gm)
    if not shape or _written_by_others(gm, shape):
        return 0
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    returned = {_root(n) for out in gm.graph.nodes if out.op == "output" for n in out.all_input_nodes}
    writes = [n for n in gm.graph.nodes if n in shape and _written_root(n) is not None]
    frontier = [
        n for n in gm.graph.nodes if n in shape and _worth_keeping(n, shape) and _keepable(n, writes, order, returned)
    ]
    replaced = 0
    for index, node in enumerate(frontier):
        replaced += _replace(gm, node, shape, readers_of, writes, order, index)
    if replaced:
        _erase_unread(gm, shape)
        gm.graph.lint()
        gm.recompile()
    return replaced


def _shape_values(gm: fx.GraphModule) -> tuple[set[fx.Node], dict[fx.Node, set[fx.Node]]]:
    """The shape values, and for each metadata reader the tensors it reads only the metadata of (its leaves)."""
    shape: set[fx.Node] = set()
    readers_of: dict[fx.Node, set[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            shape.add(node)
        elif node.op == "call_module":
            if isinstance(module_of(node, gm), FoldedConstant) and all(n in shape for n in node.all_input_nodes):
                shape.add(node)
        elif node.op in ("call_function", "call_method"):
            if _reads_metadata(node):
                shape.add(node)
                readers_of[node] = {n for n in node.all_input_nodes if n not in shape}
            elif (node.all_input_nodes and all(n in shape for n in node.all_input_nodes) and _deterministic(node)) or (
                not node.all_input_nodes and _factory(node)
            ):
                shape.add(node)
    return shape, readers_of


def _reads_metadata(node: fx.Node) -> bool:
    target = node.target
    if node.op == "call_method":
        return target in _METHOD_METADATA
    if target is scores_zeros:
        return True
    if target is getattr:
        return len(node.args) == 2 and node.args[1] in _ATTRIBUTE_METADATA
    schema = _compat.operator_schema(target)
    return schema is not None and schema.name.removeprefix("aten::") in _ATEN_METADATA


def _deterministic(node: fx.Node) -> bool:
    """An operation on shape values whose result depends on them alone and that writes nothing but its operands."""
    if node.target is operator.getitem or node.target in (operator.add, operator.sub, operator.mul, operator.floordiv):
        return True
    if foldable(node):
        return True
    schema = _compat.operator_schema(node.target)
    if schema is None or _compat.draws_random_numbers(node.target):
        return False
    if node.target in getattr(fx.node, "_side_effectful_functions", set()) or "assert" in str(node.target):
        return False
    return bool(schema.name.startswith("aten::"))


def _factory(node: fx.Node) -> bool:
    """An ATen operator with no tensor operand (arange, zeros, full), deterministic."""
    schema = _compat.operator_schema(node.target)
    return (
        schema is not None
        and schema.name.startswith("aten::")
        and not _compat.draws_random_numbers(node.target)
        and not writes_in_place(node.target)
        and "empty" not in schema.name  # (uninitialized memory)
    )


def _root(node: fx.Node) -> fx.Node:
    """The tensor a chain of views of ``node`` leads back to."""
    while node.op in ("call_function", "call_method") and is_view(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _written_root(node: fx.Node) -> fx.Node | None:
    """The tensor an in-place operation writes into (through any views); None for any other node."""
    if node.op in ("call_function", "call_method") and writes_in_place(node.target) and node.args:
        target = node.args[0]
        return _root(target) if isinstance(target, fx.Node) else None
    return None


def _written_by_others(gm: fx.GraphModule, shape: set[fx.Node]) -> bool:
    """Whether an operation that is not a shape value writes one in place."""
    return any(node not in shape and _written_root(node) in shape for node in gm.graph.nodes)


def _is_tensor(node: fx.Node) -> bool:
    """Whether the node's value is a tensor (what is kept); sizes and other scalars are not."""
    value = node.meta.get("val", node.meta.get("example_value"))
    if value is not None:
        return isinstance(value, torch.Tensor)
    if node.op == "call_method":
        return node.target not in ("size", "dim")
    if node.target is scores_zeros:
        return True
    schema = _compat.operator_schema(node.target)
    return schema is not None and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"


def _worth_keeping(node: fx.Node, shape: set[fx.Node]) -> bool:
    """A tensor something else reads, made by computing: not the model's tensor or a kept transform of it, nor
    only views of those (``cls_token.expand(batch, -1, -1)``: a view costs less than the key that would keep it)."""
    if node.op in ("get_attr", "call_module") or not _is_tensor(node):
        return False
    if all(user in shape for user in node.users):
        return False
    pending, seen = [node], set()
    while pending:
        n = pending.pop()
        if n in seen or n.op in ("get_attr", "call_module") or _reads_metadata(n) or not _is_tensor(n):
            continue  # (sizes and the arithmetic on them are read, not kept)
        seen.add(n)
        if not is_view(n) and n.target is not operator.getitem:
            return True
        pending.extend(i for i in n.all_input_nodes if i in shape)
    return False


def _keepable(node: fx.Node, writes: list[fx.Node], order: dict[fx.Node, int], returned: set[fx.Node]) -> bool:
    """Not returned, and every in-place write of a shape value into it before anything else reads it."""
    root = _root(node)
    if root in returned:
        return False  # (or a view of it: the caller may write what it is given)
    # (Its views and the writes through them are not reads: a view read elsewhere is checked as a value itself.)
    reads = [order[u] for u in node.users if _root(u) is not root and _written_root(u) is not root]
    first_read = min(reads, default=len(order))
    return all(order[w] < first_read for w in writes if _written_root(w) is root)


def _needed(node: fx.Node, shape: set[fx.Node], writes: list[fx.Node]) -> list[fx.Node]:
    """The shape values ``node`` is computed from, with the in-place writes into them (Swin's slices of its window
    mask filled in place) and what those read, in graph order."""
    needed: set[fx.Node] = set()
    pending = [node]
    while pending:
        while pending:
            n = pending.pop()
            if n not in needed:
                needed.add(n)
                pending.extend(i for i in n.all_input_nodes if i in shape)
        roots = {_root(n) for n in needed}
        pending = [w for w in writes if w not in needed and _written_root(w) in roots]
    return [n for n in node.graph.nodes if n in needed]


def _replace(
    gm: fx.GraphModule,
    node: fx.Node,
    shape: set[fx.Node],
    readers_of: dict[fx.Node, set[fx.Node]],
    writes: list[fx.Node],
    order: dict[fx.Node, int],
    index: int,
) -> int:
    ordered = _needed(node, shape, writes)
    inputs = sorted({leaf for n in ordered for leaf in readers_of.get(n, ())}, key=order.__getitem__)
    models = [n for n in ordered if n.op in ("get_attr", "call_module")]
    leaves = inputs + models
    readers = [u for u in node.users if u not in shape]
    first_read = min(readers, key=order.__getitem__)  # (every leaf comes before it: it reads what they make)
    expression = extract_subgraph(ordered, leaves, node, gm)
    module = ShapeValues(expression, tuple(leaf in inputs for leaf in leaves), node.name)
    name = f"ember_shape_values_{index}"
    gm.add_submodule(name, module)
    with gm.graph.inserting_before(first_read):
        kept = gm.graph.call_module(name, tuple(leaves))
    kept.meta = dict(node.meta)
    for reader in readers:
        reader.replace_input_with(node, kept)
    return len(readers)


def _erase_unread(gm: fx.GraphModule, shape: set[fx.Node]) -> None:
    """The shape values nothing reads any more, with the in-place writes into them, readers first. A write is kept
    while the value it writes into is read by anything but such writes."""

    def read(node: fx.Node) -> bool:
        """Read by something other than a write into it or a further view of it (whose own readers count)."""
        root = _root(node)
        return any(_root(u) is not root and _written_root(u) is not root for u in node.users)

    while True:
        live_roots = {_root(n) for n in gm.graph.nodes if n in shape and read(n)}
        erased = False
        for node in reversed(list(gm.graph.nodes)):
            if node not in shape or node.users or node.op == "get_attr":
                continue
            if _written_root(node) in live_roots:
                continue
            gm.graph.erase_node(node)
            erased = True
        if not erased:
            return
