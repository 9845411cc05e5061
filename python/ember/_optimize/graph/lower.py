"""The first pass: every Linear, convolution and constant-weight matmul of the graph becomes a fused node
(:mod:`~ember._optimize.graph.nodes`) on ember's kernels, with nothing fused into it yet; the passes after it fold
and fuse what follows each one.

A layer is lowered when its weight (and bias) are the model's own tensors, fixed for the graph's life: a module's,
a ``get_attr`` of a parameter or buffer, or a weight transform the folding pass keeps (``self.weight * mask``:
fold_constants). A weight computed in the forward from anything else is left to torch, as is a module with forward
hooks (the fused node would not run them) and a layer the kernels do not take.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ember import _C
from ember._graph.ops import Call, call_of
from ember._optimize.graph.nodes import ConvCall, FusedConv, FusedLinear
from ember._optimize.graph.refs import TensorOperands, has_hooks, module_of
from ember._optimize.inference.conv import Geometry, geometry_of, geometry_of_call
from ember._optimize.inference.state import COMPUTE_NAMES, LayerState, TensorRef

_CONV_FUNCTIONS = {3: "conv1d", 4: "conv2d", 5: "conv3d"}
_CONV_T_FUNCTIONS = {3: "conv_transpose1d", 4: "conv_transpose2d", 5: "conv_transpose3d"}


def lower_layers(gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype) -> list[str]:
    """Replaces each layer ember's kernels take with a fused node; returns the names of the nodes replaced."""
    linear_ok = _C.Linear.supported(COMPUTE_NAMES[compute])
    conv_ok = _C.Convolution.supported(COMPUTE_NAMES[compute])
    lowered = []
    for index, node in enumerate(list(gm.graph.nodes)):
        call = call_of(node, gm)
        if call is None:
            continue
        fused: FusedLinear | FusedConv | None = None
        if call.op in ("linear", "matmul", "addmm") and linear_ok:
            fused = _linear(node, call, gm, operands, compute)
        elif call.op in ("conv", "conv_transpose") and conv_ok:
            fused = _conv(node, call, gm, operands, compute)
        if fused is None:
            continue
        name = f"ember_{type(fused).__name__.lower()}_{index}"
        gm.add_submodule(name, fused)
        layer_input, weight, bias = _layer_operands(call)
        args: tuple[Any, ...] = (layer_input,)
        if operands.passed_as_arguments:  # (input, residual, weight, bias)
            args = (*args, None, weight, bias)
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_module(name, args)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        lowered.append(node.name)
    gm.recompile()
    return lowered


def _layer_operands(call: Call) -> tuple[Any, Any, Any]:
    """The layer's input, weight and bias operands, whatever the operation calls them."""
    o = call.operands
    if call.op == "matmul":
        return o["input"], o["other"], None
    if call.op == "addmm":
        return o["mat1"], o["mat2"], o["input"]
    return o["input"], o["weight"], o.get("bias")


def _weights(
    node: fx.Node, call: Call, gm: fx.GraphModule, operands: TensorOperands
) -> tuple[TensorRef, TensorRef | None] | None:
    """Where the layer's weight and bias live, when both are the model's own tensors (or, in a graph that passes
    them, inputs of the graph)."""
    module = module_of(node, gm)
    if module is not None:
        if has_hooks(module) or operands.passed_as_arguments:
            return None
        return TensorRef(module, "weight"), TensorRef(module, "bias")
    weight = operands.ref(call.operands.get("weight"))
    bias_operand = call.operands.get("bias")
    bias = None if bias_operand is None else operands.ref(bias_operand)
    if weight is None or (bias_operand is not None and bias is None):
        return None
    return weight, bias


def _floating_cpu(ref: TensorRef | None) -> bool:
    t = None if ref is None else ref.get()
    return t is None or (t.is_floating_point() and t.device.type == "cpu")


def _linear(
    node: fx.Node, call: Call, gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype
) -> FusedLinear | None:
    if call.op in ("matmul", "addmm"):
        # x @ W, or b + x @ W (Hugging Face's Conv1D), with a constant [in, out] W: a Linear whose weight is held
        # transposed
        _, weight_operand, bias_operand = _layer_operands(call)
        if call.op == "addmm" and (call.operands.get("beta", 1) != 1 or call.operands.get("alpha", 1) != 1):
            return None
        weight = operands.ref(weight_operand)
        bias = None if bias_operand is None else operands.ref(bias_operand)
        w = None if weight is None else weight.get()
        b = None if bias is None else bias.get()
        if weight is None or w is None or w.dim() != 2 or not _floating_cpu(weight):
            return None
        if bias_operand is not None and (b is None or b.shape != (w.shape[1],) or not _floating_cpu(bias)):
            return None  # a bias computed in the forward, or one that broadcasts otherwise
        return FusedLinear(LayerState(compute, weight, bias, transposed=True), node.name)
    refs = _weights(node, call, gm, operands)
    if refs is None or not all(_floating_cpu(r) for r in refs):
        return None
    w = refs[0].get()
    if w is None or w.dim() != 2:
        return None
    return FusedLinear(LayerState(compute, *refs), node.name)


def _conv(
    node: fx.Node, call: Call, gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype
) -> FusedConv | None:
    refs = _weights(node, call, gm, operands)
    if refs is None or not all(_floating_cpu(r) for r in refs):
        return None
    weight = refs[0].get()
    if weight is None or weight.dim() not in _CONV_FUNCTIONS:
        return None
    transposed = call.op == "conv_transpose"
    module = module_of(node, gm)
    arguments = call.operands
    geometry: Geometry | str
    if module is not None:
        geometry = geometry_of(module)  # type: ignore[arg-type]
    else:
        geometry = geometry_of_call(
            weight, arguments["stride"], arguments["padding"], arguments["dilation"], arguments["groups"],
            arguments.get("output_padding", 0) if transposed else None,
        )  # fmt: skip
    if isinstance(geometry, str):
        return None
    torch_call = _torch_call(weight.dim(), transposed, arguments, geometry)
    return FusedConv(LayerState(compute, *refs), node.name, geometry, torch_call)


def _torch_call(rank: int, transposed: bool, operands: dict[str, Any], geometry: Geometry) -> ConvCall:
    """The functional call that computes the convolution as the graph did (the module's, for a module call)."""
    stride, padding, dilation, groups = (operands[k] for k in ("stride", "padding", "dilation", "groups"))
    if transposed:
        output_padding = operands.get("output_padding", 0)
        return ConvCall(_CONV_T_FUNCTIONS[rank], (stride, padding, output_padding, groups, dilation))
    if geometry.pre_pad is not None:  # a module's padding mode other than zeros: torch pads first, then convolves
        return ConvCall(_CONV_FUNCTIONS[rank], (stride, 0, dilation, groups), geometry.pre_pad)
    return ConvCall(_CONV_FUNCTIONS[rank], (stride, padding, dilation, groups))
