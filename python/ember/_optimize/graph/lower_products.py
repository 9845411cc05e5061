"""Graph pass: a squeeze-excitation's product onto ember's kernel
(:class:`~ember._optimize.graph.product_node.FusedProduct`).

Which products: ``a * b`` of two computed tensors (``operator.mul``, ``torch.mul``, ``aten.mul.Tensor``) where one
operand is a fused convolution's output: the excitation (``conv -> relu -> conv -> sigmoid`` over the pooled
features, its activation already in the convolution's epilogue) scaling the features it was computed from. Other
products stay torch's (a gated MLP's is in its Linear's epilogue already, and nothing else is known to broadcast as
the kernel takes it); the node checks the dtypes and shapes on each call and runs torch's mul otherwise.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from ember._optimize.graph.nodes import FusedConv
from ember._optimize.graph.product_node import FusedProduct
from ember._optimize.graph.refs import module_of

_MULS = (operator.mul, torch.mul)


def lower_products(gm: fx.GraphModule) -> int:
    """Puts a FusedProduct in place of each such product; returns how many."""
    lowered = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        if node.op != "call_function" or not (node.target in _MULS or str(node.target) == "aten.mul.Tensor"):
            continue
        if len(node.args) != 2 or node.kwargs or not all(isinstance(a, fx.Node) for a in node.args):
            continue
        if not any(isinstance(module_of(a, gm), FusedConv) for a in node.args):
            continue
        name = f"ember_fusedproduct_{index}"
        gm.add_submodule(name, FusedProduct(node.name))
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(name, tuple(node.args))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        lowered += 1
    if lowered:
        gm.recompile()
    return lowered
