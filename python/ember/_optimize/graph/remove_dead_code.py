"""Operations whose results nothing reads, removed after the other passes: what a model computes and discards
(Hugging Face's attention weights when no one asks for them, a size read for a check that export specialized away),
and what the passes left behind (a reshape whose reader joined a fused node).

Only operations known to be pure go: reads of the model's tensors (``get_attr``), the vocabulary's (ember._graph.ops)
that do not work in place, ember's fused nodes, and the reads of a value (``getitem``, ``getattr``, shape, size, view
and reshape methods). FX's own ``eliminate_dead_code`` is not used: on torch before 2.x it removes in-place tensor
methods (``x.relu_()``) whose returned value no one reads, although their effect on ``x`` is read.
"""

from __future__ import annotations

import operator

from torch import fx, nn

from ember import _compat
from ember._graph.ops import call_of, writes_in_place
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.refs import module_of
from ember._optimize.graph.rope_node import FusedRope

_FUSED = (FusedLayer, FusedNorm, FusedRope, FusedAttention, FoldedConstant)
_READS = {operator.getitem, getattr}
_PURE_METHODS = {"size", "dim", "view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
                 "expand", "flatten", "float", "to", "type_as"}  # fmt: skip


def remove_dead_code(gm: fx.GraphModule) -> int:
    """Removes every pure operation no node reads, until none is left, and the fused layers no node calls any more
    (a merged Linear's parts); returns how many operations."""
    removed = 0
    for node in reversed(list(gm.graph.nodes)):  # readers before what they read: one sweep reaches the fixpoint
        if not node.users and _pure(gm, node):
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


def _pure(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "get_attr":
        return True  # a read of a tensor whose reader a pass replaced
    if node.op == "call_module":
        return isinstance(module_of(node, gm), _FUSED) or _vocabulary_pure(gm, node)
    if node.op == "call_function" and node.target in _READS:
        return True
    if node.op == "call_method" and node.target in _PURE_METHODS:
        return True
    if node.op == "call_function" and _compat.operator_schema(node.target) is not None:
        return _functional_aten(node.target)
    return node.op in ("call_function", "call_method") and _vocabulary_pure(gm, node)


def _functional_aten(target: object) -> bool:
    """An ATen overload that writes none of its arguments and has no effect besides its result (torch.export's
    graphs are of these, views included; its asserts and FX's side-effectful functions are not)."""
    if target in getattr(fx.node, "_side_effectful_functions", set()) or "assert" in str(target):
        return False
    return not writes_in_place(target)


def _vocabulary_pure(gm: nn.Module, node: fx.Node) -> bool:
    """A call of the vocabulary that does not write its input."""
    call = call_of(node, gm)
    return call is not None and not call.operands.get("inplace") and not writes_in_place(node.target)
