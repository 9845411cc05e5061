"""The last pass: torch.export's view operations called as the tensor methods they are.

An exported graph calls ATen overloads (``torch.ops.aten.transpose.int(x, 1, 2)``), and an overload's Python call
costs 2.3-2.9 us against 1.0-1.2 us for the method (``x.transpose(1, 2)``) on the 2-core Zen 5: BERT-base's graph
makes 96 such calls a forward (its heads split and merged), which at batch 1 and short sequences is time the
kernels wait for. Only overloads that are the method, argument for argument, are rewritten (no keyword
arguments), after every other pass has matched its patterns on the graph as captured.
"""

from __future__ import annotations

import torch
from torch import fx

_aten = torch.ops.aten
METHODS = {
    _aten.view.default: "view",
    _aten.reshape.default: "reshape",
    _aten.transpose.int: "transpose",
    _aten.permute.default: "permute",
    _aten.unsqueeze.default: "unsqueeze",
    _aten.squeeze.dim: "squeeze",
    _aten.select.int: "select",
    _aten.t.default: "t",
}


def views_as_methods(gm: fx.GraphModule) -> int:
    """Rewrites the view overloads :data:`METHODS` names into method calls; returns how many."""
    rewritten = 0
    for node in gm.graph.nodes:
        method = METHODS.get(node.target) if node.op == "call_function" and not node.kwargs else None
        if method is not None:
            node.op, node.target = "call_method", method
            rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
