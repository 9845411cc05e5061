"""Residual adds a fused convolution makes in place, into the residual itself.

A residual block ends in ``relu(conv(h) + identity)``: the convolution's node adds ``identity`` in its epilogue
(fuse_epilogue.py), and writes a fresh output. Where nothing reads ``identity`` after that node, its memory may take
the output instead: the kernel then accumulates into it (oneDNN's sum post-op), which is what Intel's extension did
for ResNet. oneDNN 3.2's binary add, the alternative, cost ResNet-50's sixteen residual convolutions twice what the
sum did (bf16, batch 16, 2 Sapphire Rapids cores: 34 ms against 17.7 ms in IPEX 2.8's oneDNN), and a fresh output
is one more block of memory to find and fault in per layer.

The residual must be memory no one else can see: the output of another fused layer of this graph (a fresh tensor,
never an input, a model tensor or a kept value), read before the convolution's node by fused layers alone (whose
outputs are fresh: a view, or a method that may return its tensor, would share the memory), by nothing after it,
and not the convolution's own input. The convolution's fast call (fast_calls.FastConv) checks the
rest on each call: the residual laid out and typed as the output, or a fresh output as before.
"""

from __future__ import annotations

from torch import fx

from ember._optimize.graph.nodes import FusedConv, FusedLayer


def accumulate_residuals_in_place(gm: fx.GraphModule) -> int:
    """Marks each fused convolution that may add its residual in place (see the module); returns how many."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    marked = 0
    for node in gm.graph.nodes:
        layer = _fused(gm, node)
        if not isinstance(layer, FusedConv) or not layer.steps or layer.steps[0].op != "residual":
            continue
        if len(node.args) < 2 or node.kwargs:
            continue
        x, residual = node.args[0], node.args[1]
        if not isinstance(residual, fx.Node) or residual is x or not isinstance(_fused(gm, residual), FusedLayer):
            continue
        others = [user for user in residual.users if user is not node]
        if any(order[user] > order[node] or not isinstance(_fused(gm, user), FusedLayer) for user in others):
            continue
        layer.accumulates_into_operand = True
        marked += 1
    return marked


def _fused(gm: fx.GraphModule, node: fx.Node) -> object:
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None
