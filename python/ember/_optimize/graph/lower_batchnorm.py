"""Eval-mode BatchNorms that no layer before them took in (:mod:`fold_batchnorm` runs first) onto ember's
per-channel kernel (:class:`~ember._optimize.graph.batchnorm_node.FusedBatchNorm`), with a ReLU read by the norm
alone taken into the same pass.

Pre-activation networks normalize before the convolution: DenseNet's every dense layer applies BatchNorm and ReLU
to the concatenation of all earlier features, and torch ran them as two passes over it (a channels-last bf16 one
each), the ReLU's over a fresh allocation. Here it is one read and one write.

Any spelling: a BatchNorm module (without hooks), ``F.batch_norm`` with ``training=False`` over the model's tensors,
``aten.batch_norm``; not where the graph's tensors arrive as arguments (the ``torch.compile`` backend), nor a
statistic computed in the forward.
"""

from __future__ import annotations

from torch import fx

from ember._graph.ops import call_of
from ember._graph.patterns import call_if, only_reader
from ember._optimize.graph.batchnorm_node import FusedBatchNorm
from ember._optimize.graph.fold_batchnorm import batchnorm_refs
from ember._optimize.graph.refs import TensorOperands


def lower_batchnorms(gm: fx.GraphModule, operands: TensorOperands) -> tuple[int, int]:
    """Replaces every eval-mode BatchNorm left in the graph with the kernel's node; returns (norms, ReLUs taken
    in)."""
    norms = relus = 0
    if operands.passed_as_arguments:
        return 0, 0
    for index, node in enumerate(list(gm.graph.nodes)):
        call = call_of(node, gm)
        if call is None or call.op != "batch_norm" or not isinstance(call.operands.get("input"), fx.Node):
            continue
        norm = batchnorm_refs(node, call, gm, operands)
        if norm is None:
            continue
        relu = _only_relu_after(node, gm)
        fused = FusedBatchNorm(norm, relu is not None, node.name)
        name = f"ember_batchnorm_{index}"
        gm.add_submodule(name, fused)
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_module(name, (call.operands["input"],))
        last = relu if relu is not None else node
        replacement.meta = dict(last.meta)
        last.replace_all_uses_with(replacement)
        if relu is not None:
            gm.graph.erase_node(relu)
            relus += 1
        gm.graph.erase_node(node)
        norms += 1
    gm.recompile()
    return norms, relus


def _only_relu_after(node: fx.Node, gm: fx.GraphModule) -> fx.Node | None:
    """The ReLU that alone reads the norm's result, if one does."""
    if len(node.users) != 1:
        return None
    (user,) = node.users
    relu = call_if(user, gm, "relu")
    return user if relu is not None and relu.operands.get("input") is node and only_reader(node, user) else None
