"""Rotary position embeddings in the rotate-half form onto ember's kernel
(:class:`~ember._optimize.graph.rope_node.FusedRope`): Hugging Face's Llama, Mistral, Qwen2, Phi-3 and GPT-NeoX apply
them to every query and key as

    rotate_half(x) = cat((-x[..., h:], x[..., :h]), dim=-1)
    x * cos + rotate_half(x) * sin

which a graph records as two slices, a negation, a concatenation, two multiplies and an add (ATen's
``slice.Tensor``, ``neg``, ``cat``, ``mul.Tensor``, ``add.Tensor`` under torch.export). The slices must split the
last dimension at one bound h (the pass checks the result's width equals 2h on every call), each intermediate must be
read by the next step alone, and the multiplies and the add may take their operands in either order. The
interleaved form (GPT-J's, pairs of adjacent features) is a different pattern and stays torch's.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import fx, nn

from ember._graph.ops import Call, call_of
from ember._graph.patterns import call_if, is_last_dim, only_reader
from ember._optimize.graph.rope_node import FusedRope


def fuse_rope(gm: fx.GraphModule) -> int:
    """Replaces every rotate-half rotary embedding with a fused node; returns how many."""
    fused = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        if node.graph is not gm.graph:  # erased by an earlier match
            continue
        call = call_of(node, gm)
        if call is None or call.op != "add" or call.operands.get("alpha", 1) != 1 or call.operands.get("inplace"):
            continue
        found = _match(node, call, gm)
        if found is not None:
            _install(gm, node, *found, f"ember_fusedrope_{index}")
            fused += 1
    gm.recompile()
    return fused


def _factors(call: Call) -> tuple[Any, Any]:
    return call.operands["input"], call.operands["other"]


def _match(add: fx.Node, call: Call, gm: fx.GraphModule) -> tuple[fx.Node, Any, Any, list[fx.Node], int] | None:
    """(x, cos, sin, the nodes replaced in graph order, h) of a rotary embedding ending in ``add``."""
    for direct, rotated in (_factors(call), _factors(call)[::-1]):
        plain, turned = call_if(direct, gm, "mul"), call_if(rotated, gm, "mul")
        if plain is None or turned is None or not only_reader(direct, add) or not only_reader(rotated, add):
            continue
        for cat_node, sin in (_factors(turned), _factors(turned)[::-1]):
            parts = _rotate_half(cat_node, rotated, gm)
            if parts is None:
                continue
            x, inner, half = parts
            for x_side, cos in (_factors(plain), _factors(plain)[::-1]):
                if x_side is x and isinstance(cos, fx.Node) and isinstance(sin, fx.Node):
                    nodes = [*inner, cat_node, rotated, direct, add]
                    order = {n: i for i, n in enumerate(gm.graph.nodes)}
                    return x, cos, sin, sorted(nodes, key=order.__getitem__), half
    return None


def _rotate_half(cat_node: Any, reader: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node, list[fx.Node], int] | None:
    """(x, [the slices and the negation], h) where ``cat_node`` is ``cat((-x[..., h:], x[..., :h]), -1)`` read by
    ``reader`` alone."""
    cat = call_if(cat_node, gm, "cat")
    if cat is None or not only_reader(cat_node, reader):
        return None
    tensors = cat.operands.get("tensors")
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2:
        return None
    negated, low = tensors
    neg = call_if(negated, gm, "neg")
    if neg is None or not only_reader(negated, cat_node) or not only_reader(low, cat_node):
        return None
    high = neg.operands["input"]
    high_slice, low_slice = call_if(high, gm, "slice"), call_if(low, gm, "slice")
    if high_slice is None or low_slice is None or not only_reader(high, negated):
        return None
    x = high_slice.operands["input"]
    if low_slice.operands["input"] is not x or not isinstance(x, fx.Node):
        return None
    if not (is_last_dim(cat.operands.get("dim"), cat_node) and is_last_dim(high_slice.operands.get("dim"), x)
            and is_last_dim(low_slice.operands.get("dim"), x)):  # fmt: skip
        return None
    half = low_slice.operands.get("end")
    if not isinstance(half, int) or half <= 0:
        return None
    if low_slice.operands.get("start") not in (None, 0) or high_slice.operands.get("start") != half:
        return None
    if high_slice.operands.get("end") not in (None, sys.maxsize, 2 * half):
        return None
    if low_slice.operands.get("step", 1) != 1 or high_slice.operands.get("step", 1) != 1:
        return None
    value = x.meta.get("val")
    if (
        value is not None
        and hasattr(value, "shape")
        and isinstance(value.shape[-1], int)
        and value.shape[-1] != 2 * half
    ):
        return None
    return x, [high, negated, low], half


def _install(gm: fx.GraphModule, add: fx.Node, x: fx.Node, cos: Any, sin: Any, nodes: list[fx.Node], half: int,
             name: str) -> None:  # fmt: skip
    fused = FusedRope(_original(gm, x, cos, sin, nodes), half, add.name)
    gm.add_submodule(name, fused)
    with gm.graph.inserting_before(add):
        node = gm.graph.call_module(name, (x, cos, sin))
    node.meta = dict(add.meta)
    add.replace_all_uses_with(node)
    for n in reversed(nodes):
        gm.graph.erase_node(n)


def _original(gm: fx.GraphModule, x: fx.Node, cos: Any, sin: Any, nodes: list[fx.Node]) -> fx.GraphModule:
    """The graph's own operations as a GraphModule of (x, cos, sin)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for operand, name in ((x, "x"), (cos, "cos"), (sin, "sin")):
        placeholder = graph.placeholder(name)
        env.setdefault(operand, placeholder)
    for n in nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[nodes[-1]])
    return fx.GraphModule(nn.Module(), graph)
