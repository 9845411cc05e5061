"""Each ``nn.MultiheadAttention`` call a symbolic trace kept as one call onto ember's kernels
(:class:`~ember._optimize.graph.multihead_node.FusedMultiheadAttention`): the node keeps the call's arguments and
runs the module itself for every call it does not take.

Dynamo records the module's call as ``F.multi_head_attention_forward`` with the weights as arguments (its
sequence-first form): that call gets a fused node too
(:class:`~ember._optimize.graph.multihead_node.FusedMultiheadAttentionCall`), where it is self-attention without
masks or weights returned. torch's own function there ran its projections 3x slower than eager at batch 4.

Left to torch: a module with forward hooks (on it or its output projection), a configuration the node does not run
(not batch-first, separate Q/K/V weights, ``bias_k``/``bias_v``, ``add_zero_attn``), and a compute dtype the
attention kernel does not take (fp16).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ember import _C
from ember._optimize.graph.multihead_node import FusedMultiheadAttention, FusedMultiheadAttentionCall, fusable
from ember._optimize.graph.refs import TensorOperands, has_hooks, module_of
from ember._optimize.inference.state import COMPUTE_NAMES, LayerState


def lower_multihead_attention(gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype) -> int:
    """Points each such call at a fused node; returns how many."""
    if compute not in (torch.float32, torch.bfloat16) or not _C.Linear.supported(COMPUTE_NAMES[compute]):
        return 0
    lowered = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        module = module_of(node, gm)
        if isinstance(module, nn.MultiheadAttention) and not operands.passed_as_arguments:
            if not fusable(module) or has_hooks(module) or has_hooks(module.out_proj):
                continue
            name = f"ember_fusedmultiheadattention_{index}"
            gm.add_submodule(name, FusedMultiheadAttention(module, compute, str(node.target)))
            node.target = name
            lowered += 1
        elif node.op == "call_function" and node.target is F.multi_head_attention_forward:
            found = _functional(node, operands, compute)
            if found is None:
                continue
            fused, args = found
            name = f"ember_fusedmultiheadattentioncall_{index}"
            gm.add_submodule(name, fused)
            with gm.graph.inserting_before(node):
                call = gm.graph.call_module(name, args)
            call.meta = dict(node.meta)
            node.replace_all_uses_with(call)
            gm.graph.erase_node(node)
            lowered += 1
    gm.recompile()
    return lowered


# What F.multi_head_attention_forward's other arguments must be for the fused call (dynamo records every one).
_FIXED = {
    "bias_k": None, "bias_v": None, "add_zero_attn": False, "key_padding_mask": None, "need_weights": False,
    "attn_mask": None, "use_separate_proj_weight": False, "q_proj_weight": None, "k_proj_weight": None,
    "v_proj_weight": None, "static_k": None, "static_v": None, "is_causal": False,
}  # fmt: skip


def _bound(node: fx.Node) -> dict[str, Any] | None:
    try:
        bound = inspect.signature(F.multi_head_attention_forward).bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _functional(
    node: fx.Node, operands: TensorOperands, compute: torch.dtype
) -> tuple[FusedMultiheadAttentionCall, tuple[Any, ...]] | None:
    """The fused node for ``F.multi_head_attention_forward`` as dynamo records an ``nn.MultiheadAttention`` call,
    and its call's arguments (query, then the projections' weights and biases), when it is self-attention without
    masks or weights returned, its weights the model's."""
    a = _bound(node)
    if a is None or not (isinstance(a["query"], fx.Node) and a["query"] is a["key"] is a["value"]):
        return None
    if any(a.get(key, value) is not value for key, value in _FIXED.items()):  # (None and False: singletons)
        return None
    heads, embed, dropout, training = a["num_heads"], a["embed_dim_to_check"], a["dropout_p"], a["training"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (heads, embed)) or embed % heads:
        return None
    if not isinstance(training, bool) or not isinstance(dropout, float) or (training and dropout != 0.0):
        return None
    refs = [operands.ref(a[k]) for k in ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias")]
    if refs[0] is None or refs[2] is None or (a["in_proj_bias"] is None) != (refs[1] is None):
        return None
    if (a["out_proj_bias"] is None) != (refs[3] is None):
        return None
    in_proj = LayerState(compute, refs[0], refs[1])
    out_proj = LayerState(compute, refs[2], refs[3])
    weights = tuple(a[k] for k in ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias"))
    return FusedMultiheadAttentionCall(in_proj, out_proj, heads, dropout, training, node.name), (a["query"], *weights)
