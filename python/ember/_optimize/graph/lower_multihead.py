"""Each ``nn.MultiheadAttention`` call a symbolic trace kept as one call onto ember's kernels
(:class:`~ember._optimize.graph.multihead_node.FusedMultiheadAttention`): the node keeps the call's arguments and
runs the module itself for every call it does not take.

Left to torch: a module with forward hooks (on it or its output projection), a configuration the node does not run
(not batch-first, separate Q/K/V weights, ``bias_k``/``bias_v``, ``add_zero_attn``), a compute dtype the attention
kernel does not take (fp16), and graphs that pass the model's parameters as inputs (dynamo's, where the module is
not one call).
"""

from __future__ import annotations

import torch
from torch import fx, nn

from ember import _C
from ember._optimize.graph.multihead_node import FusedMultiheadAttention, fusable
from ember._optimize.graph.refs import TensorOperands, has_hooks, module_of
from ember._optimize.inference.state import COMPUTE_NAMES


def lower_multihead_attention(gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype) -> int:
    """Points each such call at a fused node; returns how many."""
    if compute not in (torch.float32, torch.bfloat16) or operands.passed_as_arguments:
        return 0
    if not _C.Linear.supported(COMPUTE_NAMES[compute]):
        return 0
    lowered = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        module = module_of(node, gm)
        if not isinstance(module, nn.MultiheadAttention) or not fusable(module):
            continue
        if has_hooks(module) or has_hooks(module.out_proj):
            continue
        name = f"ember_fusedmultiheadattention_{index}"
        gm.add_submodule(name, FusedMultiheadAttention(module, compute, str(node.target)))
        node.target = name
        lowered += 1
    gm.recompile()
    return lowered
