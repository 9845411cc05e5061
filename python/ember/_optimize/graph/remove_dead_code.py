"""Operations whose results nothing reads, removed after the other passes: what a model computes and discards
(Hugging Face's attention weights when no one asks for them, a size read for a check that export specialized away),
and what the passes left behind (a reshape whose reader joined a fused node).

Only operations known to be pure go (:mod:`purity`). FX's own ``eliminate_dead_code`` is not used: on torch before
2.x it removes in-place tensor methods (``x.relu_()``) whose returned value no one reads, although their effect on
``x`` is read.
"""

from __future__ import annotations

from torch import fx

from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.purity import is_pure


def remove_dead_code(gm: fx.GraphModule) -> int:
    """Removes every pure operation no node reads, until none is left, and the fused layers no node calls any more
    (a merged Linear's parts); returns how many operations."""
    removed = 0
    for node in reversed(list(gm.graph.nodes)):  # readers before what they read: one sweep reaches the fixpoint
        if not node.users and is_pure(gm, node):
            gm.graph.erase_node(node)
            removed += 1
    _drop_uncalled_fused_modules(gm)
    gm.recompile()
    return removed


def _drop_uncalled_fused_modules(gm: fx.GraphModule) -> None:
    # Each forward checks every fused layer the graph holds (fast_calls.GraphGuard): one no node calls would cost that
    # check on every call (BERT-base kept 36 of its 85, the parts of its Q/K/V merges).
    # (Only layers: a folded constant is read through its consumers' refs, not by a node.)
    named = {n.target for n in gm.graph.nodes if n.op in ("call_module", "get_attr")}
    for name, module in list(gm.named_children()):
        if isinstance(module, FusedLayer) and name not in named:
            delattr(gm, name)
