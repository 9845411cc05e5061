"""A multiplication of a Linear's output by a tensor of the model, one factor per output channel, folded into the
Linear's weights and bias: a layer scale (ConvNeXt's ``gamma * x``, CaiT's and DeiT III's ``gamma * x`` after the
MLP, Hugging Face's ConvNext ``layer_scale_parameter * x``). The product may come after a permutation of the
Linear's output (torchvision's ConvNeXt multiplies ``layer_scale`` [C, 1, 1] into the output permuted back to
[N, C, H, W]). The weights are made in float64 when the kernel is built, from the scale as it is then (a changed
scale rebuilds them, as a changed BatchNorm statistic does), and the Linear's result takes the dtype torch's
product gives: an fp32 scale times a bf16 output is fp32, and the residual stream after it stays fp32 as under
autocast.

The fold needs the Linear's output (and the permutation's) to have no other user, a Linear with nothing fused after
it yet (the factor must come before any activation), and a factor tensor that varies only along the output channels
(a scalar tensor stays torch's: a plain number is the epilogue's). Not folded: a factor computed in the forward, a
convolution's output (its kernel keeps its input's dtype), merged Linears.
"""

from __future__ import annotations

import torch
from torch import fx

from ember._graph.ops import call_of
from ember._graph.patterns import permutation, recorded_shape
from ember._optimize.graph.epilogue import step_of
from ember._optimize.graph.nodes import FusedLinear
from ember._optimize.graph.refs import TensorOperands, module_of
from ember._optimize.inference.state import TensorRef


def fold_scales(gm: fx.GraphModule, operands: TensorOperands) -> int:
    """Folds every scale the rules above allow; returns how many."""
    folded = 0
    for node in list(gm.graph.nodes):
        layer = module_of(node, gm)
        if type(layer) is not FusedLinear or layer.steps or layer.state.scale is not None or len(node.users) != 1:
            continue
        value, channel_dim, rank = _through_permute(node)
        if len(value.users) != 1:
            continue
        (user,) = value.users
        found = _factor(user, value, gm, operands)
        if found is None:
            continue
        factor_node, ref = found
        factor = ref.get()
        channels = layer.state.weight().shape[0]
        if factor is None or not _per_channel(factor, _recorded_rank(user, rank), channel_dim, channels):
            continue
        layer.state.fold_scale(ref)
        if operands.passed_as_arguments:  # the fused node's arguments go on with the scale
            node.args = (*node.args, factor_node)
        user.replace_all_uses_with(value)
        gm.graph.erase_node(user)
        folded += 1
    gm.recompile()
    return folded


def _through_permute(node: fx.Node) -> tuple[fx.Node, int, int | None]:
    """The value the product reads (the Linear's output, or its one permutation), the dimension of that value its
    channels are on (counted from the end: -1, the Linear's last, unless permuted), and its rank where the
    permutation tells it. (Past a permutation by dimensions that are not plain numbers the channels are not known:
    the value is then the Linear's output, whose one reader, that permutation, is no product.)"""
    (user,) = node.users
    dims = permutation(user)
    if dims is None or user.args[0] is not node:
        return node, -1, None
    rank = len(dims)
    return user, [d % rank for d in dims].index(rank - 1) - rank, rank  # where the Linear's last dimension went


def _factor(
    user: fx.Node, value: fx.Node, gm: fx.GraphModule, operands: TensorOperands
) -> tuple[fx.Node, TensorRef] | None:
    """The model's tensor ``user`` multiplies ``value`` by (the epilogue's reading of a product by a tensor), and
    where it lives; None for any other operation."""
    call = call_of(user, gm)
    found = None if call is None else step_of(call, value, has_operand=False)
    if found is None or found[0].op != "product" or found[1] is None:
        return None
    ref = operands.ref(found[1])
    return (found[1], ref) if ref is not None else None


def _recorded_rank(product: fx.Node, known: int | None) -> int | None:
    """The rank of the product's value: ``known`` (a permutation's), else the graph's recorded shape's, if any."""
    if known is not None:
        return known
    shape = recorded_shape(product)
    return None if shape is None else len(shape)


def _per_channel(factor: torch.Tensor, rank: int | None, channel_dim: int, channels: int) -> bool:
    """Whether ``factor`` (fp32 or bf16), broadcast against the product's other operand (of ``rank`` dimensions
    where known), varies only along its channels (at ``channel_dim`` from the end) and leaves that operand's shape
    as it is: at most ``rank`` dimensions, 1 everywhere but at ``channel_dim``, ``channels`` there. With the rank
    unknown, only a vector of ``channels`` factors along the last dimension, which never adds a dimension."""
    if factor.dtype not in (torch.float32, torch.bfloat16) or factor.numel() != channels or channels == 1:
        return False
    shape = tuple(factor.shape)
    if rank is None:
        return len(shape) == 1 and channel_dim == -1
    if len(shape) > rank or len(shape) < -channel_dim:
        return False
    return all(size == (channels if d - len(shape) == channel_dim else 1) for d, size in enumerate(shape))
