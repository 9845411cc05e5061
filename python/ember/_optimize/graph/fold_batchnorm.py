"""BatchNorm folded into the Linear or convolution that feeds it: ``batch_norm(layer(x))`` with running statistics
is an affine map per output channel, which the layer's weights and bias take in (computed in float64 when the
kernel is built, from the model's BatchNorm tensors as they are then: a changed statistic rebuilds it).

Any spelling folds: a BatchNorm module, ``F.batch_norm`` with ``training=False``, ``aten.batch_norm``. Not yet: a
frozen BatchNorm written out as a per-channel multiply-add (torchvision's FrozenBatchNorm2d, traced through into
``x * scale + shift`` with tensors computed in the forward). The fold needs the
layer's output to have no other user (that user would need the unnormalized values), a BatchNorm over the layer's
output channels, and a layer whose output channels are its weight's first dimension (not a transposed
convolution).
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ember._graph.ops import Call, call_of
from ember._optimize.graph.nodes import FusedConv, FusedLayer
from ember._optimize.graph.refs import TensorOperands, has_hooks, module_of
from ember._optimize.inference.state import FoldedBatchNorm, TensorRef


def fold_batchnorms(gm: fx.GraphModule, operands: TensorOperands) -> int:
    """Folds every BatchNorm the rules above allow; returns how many."""
    folded = 0
    for node in list(gm.graph.nodes):
        layer = module_of(node, gm)
        if not isinstance(layer, FusedLayer) or layer.state.bn is not None or layer.steps:
            continue
        if isinstance(layer, FusedConv) and layer.geometry.transposed:
            continue
        if len(node.users) != 1:
            continue
        (user,) = node.users
        found = _batchnorm(user, node, gm, operands)
        if found is None or not _matches(layer, found[0]):
            continue
        norm, passed = found
        layer.state.fold(norm)
        if operands.passed_as_arguments:  # the fused node's arguments go on with the BatchNorm's tensors
            node.args = (*node.args, *passed)
        user.replace_all_uses_with(node)
        gm.graph.erase_node(user)
        folded += 1
    gm.recompile()
    return folded


def _batchnorm(
    user: fx.Node, value: fx.Node, gm: fx.GraphModule, operands: TensorOperands
) -> tuple[FoldedBatchNorm, tuple[Any, ...]] | None:
    """The BatchNorm ``user`` applies to ``value`` with running statistics, as refs, and its tensor operands in
    ``LayerState.tensors()``' order (weight, bias, running mean and variance); else None."""
    call = call_of(user, gm)
    if call is None or call.op != "batch_norm" or call.operands["input"] is not value:
        return None
    norm = batchnorm_refs(user, call, gm, operands)
    if norm is None:
        return None
    if module_of(user, gm) is not None:
        return norm, ()
    passed = tuple(call.operands.get(name) for name in ("weight", "bias", "running_mean", "running_var"))
    return norm, passed


def batchnorm_refs(node: fx.Node, call: Call, gm: fx.GraphModule, operands: TensorOperands) -> FoldedBatchNorm | None:
    """Where the BatchNorm ``node`` makes (``call``) finds its statistics, affine tensors and epsilon: its module's
    (one without hooks, in a graph whose tensors are not passed as arguments), or the model's tensors a functional
    call names; None for tensors computed in the forward. The one reading of a BatchNorm for :mod:`fold_batchnorm`
    and :mod:`lower_batchnorm`."""
    module = module_of(node, gm)
    if module is not None:
        if has_hooks(module) or operands.passed_as_arguments:
            return None
        return FoldedBatchNorm.of_module(module)  # type: ignore[arg-type]
    refs: dict[str, TensorRef | None] = {}
    for name in ("running_mean", "running_var", "weight", "bias"):
        operand = call.operands.get(name)
        refs[name] = None if operand is None else operands.ref(operand)
        if operand is not None and refs[name] is None:
            return None  # statistics or affine tensors computed in the forward
    mean, var, eps = refs["running_mean"], refs["running_var"], call.operands.get("eps")
    if mean is None or var is None or not isinstance(eps, float):
        return None
    return FoldedBatchNorm(mean, var, refs["weight"], refs["bias"], eps)


def _matches(layer: FusedLayer, norm: FoldedBatchNorm) -> bool:
    """Whether the BatchNorm normalizes the layer's output channels: one statistic per output channel (a Linear's
    output must also be 2-D at run time, which the kernel's plan checks: BatchNorm1d reads channels from dimension
    1)."""
    channels = layer.state.weight().shape[0]
    weight, bias, mean, var = norm.tensors()
    if mean is None or var is None:
        return False
    return all(t is None or t.shape == (channels,) for t in (weight, bias, mean, var))
