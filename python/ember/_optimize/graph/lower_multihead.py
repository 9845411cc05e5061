"""Each ``nn.MultiheadAttention`` call a symbolic trace kept as one call, onto ember's kernels.

Where the graph itself says the call is self-attention without masks or weights returned (``query``, ``key`` and
``value`` one node, ``need_weights=False``, no ``attn_mask`` or ``key_padding_mask``: torchvision's ViT), the call is
written out in the graph as the operations it is: the stacked input projection (``F.linear`` on ``in_proj_weight``),
Q, K and V as views of its output, ``F.scaled_dot_product_attention`` (the written-out softmax on torch 1.13), the
heads merged back (a view of the attention's output, which the kernel lays out so) and the output projection. The
passes after this one then treat them as any model's: the projections on ember's Linear, the residual add after the
output projection in its epilogue, the attention on ember's kernel reading Q, K and V where the GEMM wrote them, and
the whole encoder layer in one replayed segment. As one opaque node it took 17.9 ms on the Xeon (ViT-B/16, bf16,
batch 1) where Hugging Face's ViT, the same shapes written out, took 13.1 ms.

A call the graph cannot tell so statically (a mask or ``need_weights`` passed as a value) gets a node that checks on
each call (:class:`~ember._optimize.graph.multihead_node.FusedMultiheadAttention`) and runs the module itself for
every call it does not take. Dynamo records the module's call as ``F.multi_head_attention_forward`` with the weights as
arguments (its sequence-first form): that call gets a fused node too
(:class:`~ember._optimize.graph.multihead_node.FusedMultiheadAttentionCall`), where it is self-attention without
masks or weights returned. torch's own function there ran its projections 3x slower than eager at batch 4.

Left to torch: a module with forward hooks (on it or its output projection), a configuration the node does not run
(not batch-first, separate Q/K/V weights, ``bias_k``/``bias_v``, ``add_zero_attn``), and a compute dtype the
attention kernel does not take (fp16).
"""

from __future__ import annotations

import inspect
import math
import operator
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
            if _written_out(gm, node, module):
                lowered += 1
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


# What nn.MultiheadAttention.forward's arguments must be for the call to be written out (None and False: singletons).
_PLAIN = {"key_padding_mask": None, "need_weights": False, "attn_mask": None, "is_causal": False}


def _written_out(gm: fx.GraphModule, node: fx.Node, module: nn.MultiheadAttention) -> bool:
    """Writes the module's call out in the graph (the module docstring says as what) where the graph shows it is
    plain self-attention and reads only the output from its result; returns whether it did."""
    try:
        bound = inspect.signature(nn.MultiheadAttention.forward).bind(module, *node.args, **node.kwargs)
    except TypeError:
        return False
    bound.apply_defaults()
    a = bound.arguments
    x = a["query"]
    if not isinstance(x, fx.Node) or a.get("key") is not x or a.get("value") is not x:
        return False
    if any(a.get(key, value) is not value for key, value in _PLAIN.items()):  # (torch 1.13's has no is_causal)
        return False
    items = list(node.users)
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1) for u in items):
        return False  # (the result read as a whole)
    if any(u.args[1] == 1 and u.users for u in items):
        return False  # (the attention weights, None here, read)
    heads = module.num_heads
    features = module.embed_dim // heads
    graph = gm.graph
    target = str(node.target)
    with graph.inserting_before(node):
        in_weight = graph.get_attr(f"{target}.in_proj_weight")
        in_bias = graph.get_attr(f"{target}.in_proj_bias") if module.in_proj_bias is not None else None
        out_weight = graph.get_attr(f"{target}.out_proj.weight")
        out_bias = graph.get_attr(f"{target}.out_proj.bias") if module.out_proj.bias is not None else None
        qkv = graph.call_function(F.linear, (x, in_weight, in_bias))
        # [..., length, 3 * embed] as [..., length, 3, heads, features]; q, k, v each [..., heads, length, features],
        # views of the projection's output (batched or not: only the last dimensions are named)
        parts = graph.call_method("unbind", (graph.call_method("unflatten", (qkv, -1, (3, heads, features))), -3))
        q, k, v = (graph.call_method("transpose", (graph.call_function(operator.getitem, (parts, i)), -3, -2))
                   for i in range(3))  # fmt: skip
        context = _attention(graph, q, k, v, 1.0 / math.sqrt(features))
        merged = graph.call_method("flatten", (graph.call_method("transpose", (context, -3, -2)), -2))
        out = graph.call_function(F.linear, (merged, out_weight, out_bias))
    for item in items:
        if item.args[1] == 0:
            item.replace_all_uses_with(out)
        graph.erase_node(item)
    graph.erase_node(node)
    return True


def _attention(graph: fx.Graph, q: fx.Node, k: fx.Node, v: fx.Node, scale: float) -> fx.Node:
    """``softmax(q @ k^T * scale) @ v`` as graph nodes: the call to ``F.scaled_dot_product_attention`` where torch has
    it (its default scale is this one), else written out, as fuse_attention recognizes both."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return graph.call_function(sdpa, (q, k, v))
    scores = graph.call_function(torch.matmul, (q, graph.call_method("transpose", (k, -2, -1))))
    weights = graph.call_function(F.softmax, (graph.call_function(operator.mul, (scores, scale)),), {"dim": -1})
    return graph.call_function(torch.matmul, (weights, v))


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
