"""Graph pass: each run of fused nodes, with the views, slices and size reads between them, into one
:class:`~ember._optimize.graph.replay.ReplaySegment`, which replays the run's kernel calls in one call once it has
recorded them (replay.py says why and when).

A run is a stretch of the graph, in its order, of nodes that compute nothing outside ember's kernels: fused Linears,
convolutions, norms, rotary embeddings and attentions that read the model's tensors in place (not a graph that passes
them as inputs, dynamo's), data movement (``view``, ``transpose``, ``permute``, slices, ``contiguous``, ``clone``; a
``reshape`` that copies, found when the run records, and every copy become copy steps of the replay), tuple items, size
reads, conversions to a dtype (``x.to(torch.float32)``: x itself where it has that dtype, as a Llama's residual stream
does; a float32 tensor rounded to bf16 is a step too, any other conversion leaves the run unreplayed), and values
computed from the inputs' sizes alone. Anything else ends a run; a run of one fused
node gains nothing and is left as it is. The run's nodes move into a small graph of their own (its inputs: the values it
reads from before it; its outputs: the values read after it), which the segment runs whenever it does not replay.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from ember._graph.ops import call_of, is_pad, movement_of
from ember._optimize.graph.attention_mask import scores_mask, scores_zeros
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.batchnorm_node import FusedBatchNorm
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.nodes import FusedConv, FusedLayer
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.pool_node import FusedAdaptiveAvgPool, FusedAvgPool, FusedMaxPool
from ember._optimize.graph.product_node import FusedProduct
from ember._optimize.graph.rearrangement_node import FusedRearrangement
from ember._optimize.graph.replay import ReplaySegment
from ember._optimize.graph.rope_node import FusedRope
from ember._optimize.graph.shape_values_node import ShapeValues

# Data movement: views (a reshape or flatten may copy: the recording tells), and copies (``contiguous``, ``clone``),
# which a replay makes as steps of its own (replay.Recorder.moved).
_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "permute", "transpose", "t",
                    "slice", "narrow", "squeeze", "unsqueeze", "alias", "expand", "select", "split", "chunk",
                    "unbind", "contiguous", "clone"})  # fmt: skip
_SIZE_READS = frozenset({"size", "dim", "sym_size", "numel"})


def replay_segments(gm: fx.GraphModule) -> int:
    """Puts each run of two or more fused nodes into a ReplaySegment; returns how many fused nodes the segments
    hold."""
    runs: list[list[fx.Node]] = []
    current: list[fx.Node] = []
    for node in gm.graph.nodes:
        if _role(gm, node) is None:
            runs.append(current)
            current = []
        else:
            current.append(node)
    runs.append(current)
    held = 0
    trimmed = (_trimmed(gm, run) for run in runs)
    for number, run in enumerate(run for run in trimmed if run):
        held += _segment(gm, run, number)
    if held:
        gm.graph.lint()
        gm.recompile()
    return held


def _role(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """ "kernel" for a fused node a segment replays, "view" for a node that computes nothing (or only moves data, or
    computes sizes), else None."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, FusedRearrangement):
            return "kernel"  # (a gather of rows: a step of its own)
        if isinstance(module, (FusedMaxPool, FusedAvgPool, FusedAdaptiveAvgPool, FusedBatchNorm)):
            return "kernel" if len(node.args) + len(node.kwargs) == 1 else None
        if isinstance(module, FusedProduct):
            return "kernel"
        if isinstance(module, FoldedConstant):
            return "view" if not node.args and not node.kwargs else None  # the model's tensors, read in place
        if isinstance(module, FusedLayer):
            if len(node.args) + len(node.kwargs) > 2:  # the layer's tensors passed in (dynamo's graphs)
                return None
            if isinstance(module, FusedConv) and (
                module.geometry.pre_pad is not None or len(module.geometry.stride) == 1
            ):
                return None  # (no fast call: a padding mode other than zeros runs in torch first; a 1-D convolution)
            return "kernel"
        if isinstance(module, FusedNorm):
            return "kernel" if len(node.args) + len(node.kwargs) <= 2 else None
        if isinstance(module, (FusedAttention, FusedRope)):
            return "kernel"
        if isinstance(module, ShapeValues) and all(
            is_input or _folded(gm, leaf) for is_input, leaf in zip(module.inputs, node.args)
        ):
            return "view"  # (a model's tensor it reads is a weight transform the replay checks: Swin's bias)
        return None
    if node.op not in ("call_function", "call_method"):
        return None
    if node.op == "call_function" and node.target is operator.getitem:
        return "view"  # a tuple's item, or a slice of a tensor (an index that gathers copies: found on recording)
    call = call_of(node, gm)
    if call is not None and call.op == "cat":
        return "view"  # copy steps, one per input (Swin's patch merging)
    if node.op == "call_function" and node.target in (scores_zeros, scores_mask):
        return "view"  # zeros of the scores' shape (expanded: nothing allocated), and the gathered mask, checked
    if is_pad(node):
        return "view"  # a zeroed border and a copy (Swin's windows; a copy alone where the size divides)
    if _sizes_only(node):
        return "view"  # arithmetic on sizes (``64 * x.size(0)``): the same for every call of a signature
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if isinstance(name, str) and name.split(".")[0] in _SIZE_READS:
        return "view"
    if name in ("to", "to.dtype") and len(node.args) == 2 and isinstance(node.args[1], torch.dtype) and not node.kwargs:
        return "view"  # x.to(dtype): x itself where it has that dtype (a conversion is found on recording)
    if node.op == "call_method" and node.target in _VIEWS:
        return "view"  # (methods movement_of does not name: x.unbind(d), x.split(n), x.select(d, i), x.expand(...))
    return "view" if movement_of(node) in _VIEWS else None


def _folded(gm: fx.GraphModule, node: Any) -> bool:
    """Whether ``node`` is a weight transform's value read where the model keeps it (a FoldedConstant of no
    arguments)."""
    return (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and isinstance(gm.get_submodule(str(node.target)), FoldedConstant)
        and not node.args
        and not node.kwargs
    )


_SIZE_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                              operator.neg, operator.truediv})  # fmt: skip


def _sizes_only(node: Any) -> bool:
    """Whether ``node`` computes a number from the inputs' sizes alone: a size read, an item of one, or arithmetic on
    such numbers and constants."""
    if not isinstance(node, fx.Node):
        return isinstance(node, (int, float)) and not isinstance(node, bool)
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op in ("call_function", "call_method") and isinstance(name, str) and name.split(".")[0] in _SIZE_READS:
        return True
    if node.op != "call_function":
        return False
    if node.target is getattr and len(node.args) == 2 and node.args[1] == "shape":
        return True
    if node.target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and _sizes_only(node.args[0]) and isinstance(node.args[1], int)
    return node.target in _SIZE_ARITHMETIC and not node.kwargs and all(_sizes_only(a) for a in node.args)


def _trimmed(gm: fx.GraphModule, run: list[fx.Node]) -> list[fx.Node]:
    """The run from its first fused node to its last (the tuple items read from that one included); empty where it
    holds fewer than two."""
    kernels = [i for i, n in enumerate(run) if _role(gm, n) == "kernel"]
    if len(kernels) < 2:
        return []
    end = kernels[-1] + 1
    while end < len(run) and run[end].op == "call_function" and run[end].target is operator.getitem:
        end += 1
    return run[kernels[0] : end]


def _segment(gm: fx.GraphModule, run: list[fx.Node], number: int) -> int:
    inside = set(run)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    inputs: list[fx.Node] = []
    pulled: list[fx.Node] = []
    for node in run:
        for used in node.all_input_nodes:
            if used not in inside and used not in env:
                if _folded(gm, used):
                    # A weight transform computed before the run: computed inside it instead, so that each replay
                    # checks its value (replay.Recorder.folded), which a kept value computed from it depends on.
                    env[used] = graph.node_copy(used, lambda n: env[n])
                    pulled.append(used)
                    continue
                env[used] = graph.placeholder(used.name)
                inputs.append(used)
        env[node] = graph.node_copy(node, lambda n: env[n])
    outputs = [n for n in run if any(user not in inside for user in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    sub = fx.GraphModule(gm, graph)
    kernels = tuple(gm.get_submodule(str(n.target)) for n in run if _role(gm, n) == "kernel")
    name = f"ember_replay_{number}"
    segment = ReplaySegment(sub, kernels, f"{run[0].name} .. {run[-1].name}")
    gm.add_submodule(name, segment)
    with gm.graph.inserting_after(run[-1]):
        call = gm.graph.call_module(name, tuple(inputs))
    with gm.graph.inserting_after(call):
        for i, node in enumerate(outputs):
            item = gm.graph.call_function(operator.getitem, (call, i))
            node.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
    for node in reversed(run):
        gm.graph.erase_node(node)
    for node in pulled:
        if not node.users:
            gm.graph.erase_node(node)  # (read by the run alone)
    return len(kernels)
