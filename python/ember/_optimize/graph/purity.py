"""Which graph nodes are pure: they write nothing (no argument, no module state, nothing outside the graph) and have
no effect besides their result. One home for the passes that remove or share such nodes (:mod:`remove_dead_code`,
:mod:`common_subexpressions`).

Known pure: reads of the model's tensors (``get_attr``), the vocabulary's operations (ember._graph.ops) that do not
work in place, ember's fused nodes, the reads of a value (``getitem``, ``getattr``, shape, size, view and reshape
methods), and ATen overloads whose schema writes no argument, or only its autograd metadata (``detach_``;
torch.export's graphs are of these, its asserts and FX's side-effectful functions are not). Anything else may have
an effect and is not.
"""

from __future__ import annotations

import operator

from torch import fx, nn

from ember import _compat
from ember._graph.ops import call_of, writes_in_place
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.batchnorm_node import FusedBatchNorm
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.pool_node import FusedAdaptiveAvgPool, FusedAvgPool, FusedMaxPool
from ember._optimize.graph.product_node import FusedProduct
from ember._optimize.graph.refs import module_of
from ember._optimize.graph.rope_node import FusedRope
from ember._optimize.graph.shape_values_node import ShapeValues

FUSED = (
    FusedLayer,
    FusedNorm,
    FusedRope,
    FusedAttention,
    FusedBatchNorm,
    FusedMaxPool,
    FusedAvgPool,
    FusedAdaptiveAvgPool,
    FoldedConstant,
    ShapeValues,
    FusedProduct,
)
_READS = {operator.getitem, getattr}
_PURE_METHODS = {"size", "dim", "view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
                 "expand", "flatten", "float", "to", "type_as"}  # fmt: skip


def is_pure(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` writes nothing and has no effect besides its result (see the module's docstring)."""
    if node.op == "get_attr":
        return True  # a read of a tensor whose reader a pass replaced
    if "out" in node.kwargs:
        return False  # (``torch.add(a, b, out=c)`` writes c)
    if node.op == "call_module":
        return isinstance(module_of(node, gm), FUSED) or _vocabulary_pure(gm, node)
    if node.op == "call_function" and node.target in _READS:
        return True
    if node.op == "call_method" and node.target in _PURE_METHODS:
        return True
    if node.op == "call_function" and _compat.operator_schema(node.target) is not None:
        return functional_aten(node.target)
    return node.op in ("call_function", "call_method") and _vocabulary_pure(gm, node)


# ATen overloads in place only in their argument's metadata, never its values: torch.export detaches the constants it
# lifts out of a forward so (DeBERTa's scale factors: one per layer), and graph mode runs without autograd.
METADATA_ONLY = frozenset({"aten.detach_.default"})


def functional_aten(target: object) -> bool:
    """An ATen overload that writes none of its arguments' values and has no effect besides its result."""
    if target in getattr(fx.node, "_side_effectful_functions", set()) or "assert" in str(target):
        return False
    return not writes_in_place(target) or str(target) in METADATA_ONLY


def _vocabulary_pure(gm: nn.Module, node: fx.Node) -> bool:
    """A call of the vocabulary that does not write its input."""
    call = call_of(node, gm)
    return call is not None and not call.operands.get("inplace") and not writes_in_place(node.target)
