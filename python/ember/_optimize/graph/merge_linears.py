"""Linears that read the same input merged into one GEMM (:class:`~ember._optimize.graph.nodes.FusedMergedLinear`):
a transformer's Q, K and V projections, or any other fan-out of one value into plain Linears. One call reads the
input once and multiplies it by the stacked weights; the parts' outputs are slices of its result, side by side
along the last dimension, which the graph's reshapes into heads then read where they lie.

A part must be a lowered Linear with nothing fused into it (no epilogue, no residual, no BatchNorm) whose kernel
packs a copy of its weight anyway (a weight of another dtype than the compute dtype, as an fp32 model computing in
bf16 has, or ``weights_prepack=True``): the merged layer's one packed copy of the stack then replaces the parts'
copies, and the merge costs no memory. An fp32 model computing in fp32 reads its weights in place, and merging
would add a copy of them: it is left alone. The parts must agree on the compute dtype, the input width and the
weight dtype.
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

from ember._optimize.graph.nodes import FusedLinear, FusedMergedLinear
from ember._optimize.graph.refs import TensorOperands
from ember._optimize.inference.linear import runs_in_place
from ember._optimize.inference.state import MergedLayerState


def merge_linears(gm: fx.GraphModule, operands: TensorOperands) -> int:
    """Merges each group of Linears that read one input; returns how many Linears were merged away."""
    groups: dict[Any, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        layer = _plain_linear(gm, node)
        if layer is not None:
            groups.setdefault((node.args[0], _signature(layer)), []).append(node)
    merged = 0
    for index, nodes in enumerate(g for g in groups.values() if len(g) > 1):
        _install(gm, nodes, f"ember_fusedmergedlinear_{index}", operands)
        merged += len(nodes) - 1
    gm.recompile()
    return merged


def _plain_linear(gm: fx.GraphModule, node: fx.Node) -> FusedLinear | None:
    """The lowered Linear ``node`` calls, when it can be a part of a merge."""
    if node.op != "call_module" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    layer = gm.get_submodule(str(node.target))
    if type(layer) is not FusedLinear or layer.steps or layer.state.folds:
        return None
    if len(node.args) > 1 and node.args[1] is not None:  # a residual
        return None
    try:
        weight = layer.state.weight()
    except TypeError:  # a weight the graph passes, not yet bound
        return None
    if runs_in_place(layer.state, weight):
        return None  # merging would add a copy of weights read in place
    return layer


def _signature(layer: FusedLinear) -> tuple[Any, ...]:
    weight = layer.state.weight()
    return (layer.state.compute, weight.shape[1], weight.dtype)


def _install(gm: fx.GraphModule, nodes: list[fx.Node], name: str, operands: TensorOperands) -> None:
    layers: list[FusedLinear] = []
    for n in nodes:
        layer = gm.get_submodule(str(n.target))
        assert isinstance(layer, FusedLinear)
        layers.append(layer)
    state = MergedLayerState([layer.state for layer in layers])
    fused = FusedMergedLinear(state, "+".join(layer.origin for layer in layers))
    gm.add_submodule(name, fused)
    args: tuple[Any, ...] = (nodes[0].args[0],)
    if operands.passed_as_arguments:  # (input, residual, then each part's weight and bias)
        args = (*args, None, *(t for n in nodes for t in n.args[2:4]))
    with gm.graph.inserting_before(nodes[0]):
        merged = gm.graph.call_module(name, args)
    start = 0
    for node, layer in zip(nodes, layers):
        width = layer.state.weight().shape[0]
        with gm.graph.inserting_after(merged):
            index: Any = (Ellipsis, slice(start, start + width))  # x[..., start:start + width]
            part = gm.graph.call_function(operator.getitem, (merged, index))
        part.meta = dict(node.meta)
        node.replace_all_uses_with(part)
        gm.graph.erase_node(node)
        start += width
