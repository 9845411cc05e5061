"""Max pools onto ember's kernel (:class:`~ember._optimize.graph.pool_node.FusedMaxPool`), in every form torch
records them (``nn.MaxPool2d``, ``F.max_pool2d``, ``torch.max_pool2d``, ATen's ``max_pool2d``), with a ReLU that
feeds one taken in.

A convolutional network's stem is convolution - batch norm - ReLU - max pool (ResNet, DenseNet, GoogLeNet and
Hugging Face's ResNet). ``relu(max_pool(x))`` equals ``max_pool(relu(x))`` for every input: ReLU is non-decreasing,
so the largest of the ReLUs is the ReLU of the largest, and both keep NaN (torch's ReLU and max pool propagate it).
So the ReLU moves onto the pooled values, where the pooling kernel applies it as it stores: the pass over the
convolution's output (four times the pool's for a 3x3/2 window) is gone. The ReLU must be read by the pool alone;
an in-place one, whose input other readers would see rectified, also needs its input read by it alone (and
computed in the graph: an input of the model is the caller's tensor).

The window must be known when the graph is built (ints, as every model gives them); a pool returning its indices
stays torch's.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ember._graph.ops import Call, call_of
from ember._graph.patterns import call_if, only_reader
from ember._optimize.graph.pool_node import FusedMaxPool


def lower_pooling(gm: fx.GraphModule) -> tuple[int, int]:
    """Replaces every max pool the kernel can take with a pooling node; returns (pools, ReLUs taken in)."""
    pools = relus = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        call = call_of(node, gm)
        if call is None or call.op != "max_pool2d" or call.operands.get("return_indices"):
            continue
        window = _window(call.operands)
        if window is None or not isinstance(call.operands["input"], fx.Node):
            continue
        x, relu = _rectified_input(gm, node, call.operands["input"])
        fused = FusedMaxPool(*window, relu=relu is not None, origin=node.name)
        name = f"ember_maxpool_{index}"
        gm.add_submodule(name, fused)
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_module(name, (x,))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        if relu is not None:
            gm.graph.erase_node(relu)
            relus += 1
        pools += 1
    gm.recompile()
    return pools, relus


def _pair(value: Any) -> list[int] | None:
    pair = [value, value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else None
    if pair is not None and len(pair) == 1:
        pair = pair * 2
    if pair is None or len(pair) != 2 or not all(type(v) is int for v in pair):
        return None
    return pair


def _window(operands: dict[str, Any]) -> tuple[list[int], list[int], list[int], list[int], bool] | None:
    """(kernel, stride, padding, dilation, ceil_mode) as int pairs, or None where any is not a known int."""
    kernel = _pair(operands["kernel_size"])
    stride_operand = operands.get("stride")
    empty = stride_operand is None or (isinstance(stride_operand, (list, tuple)) and len(stride_operand) == 0)
    stride = kernel if empty else _pair(stride_operand)
    padding, dilation = _pair(operands.get("padding", 0)), _pair(operands.get("dilation", 1))
    ceil_mode = operands.get("ceil_mode", False)
    if kernel is None or stride is None or padding is None or dilation is None or type(ceil_mode) is not bool:
        return None
    return kernel, stride, padding, dilation, ceil_mode


def _rectified_input(gm: fx.GraphModule, pool: fx.Node, x: fx.Node) -> tuple[fx.Node, fx.Node | None]:
    """(the pool's new input, the ReLU node it takes in or None)."""
    relu: Call | None = call_if(x, gm, "relu")
    if relu is None or not only_reader(x, pool):
        return x, None
    inner = relu.operands["input"]
    if not isinstance(inner, fx.Node):
        return x, None
    if relu.operands.get("inplace") and (inner.op not in ("call_module", "call_function", "call_method")
                                         or not only_reader(inner, x)):  # fmt: skip
        return x, None
    return inner, x
