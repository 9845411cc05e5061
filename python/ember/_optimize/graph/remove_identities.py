"""Operations that return their input in eval mode removed from the graph: dropout of every spelling with
``training=False`` (the module in eval mode, ``F.dropout(x, p, training=self.training)`` traced in eval mode,
``aten.dropout(x, p, False)``) and ``nn.Identity``. Besides the call they cost, they stand between a layer and the
residual add or activation after it, which the epilogue pass can fuse only when nothing is in between.

The graph runs in eval mode only (graph/forward.py), so a dropout traced in eval mode never has to drop anything.

torch.export's ``aten._assert_tensor_metadata`` checks go too: torch >= 2.8 puts one before each dtype conversion
(a hand-written RMSNorm has two), where it reads the value the conversion converts, so a pass that fuses the
conversion would find it read elsewhere. Each asserts a dtype the capture saw; the fused nodes keep the graph's
dtypes (graph mode runs the rewritten graph on the sample before installing it), and the asserts return nothing.
"""

from __future__ import annotations

from torch import fx

from ember._graph.ops import call_of
from ember._optimize.graph.refs import has_hooks, module_of


def remove_identities(gm: fx.GraphModule) -> int:
    """Removes every operation above; returns how many."""
    removed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and str(node.target) == "aten._assert_tensor_metadata.default":
            gm.graph.erase_node(node)
            continue
        call = call_of(node, gm)
        if call is None or has_hooks(module_of(node, gm)):
            continue
        if call.op == "identity" or (call.op == "dropout" and call.operands.get("training") is False):
            node.replace_all_uses_with(call.operands["input"])
            gm.graph.erase_node(node)
            removed += 1
    gm.recompile()
    return removed
