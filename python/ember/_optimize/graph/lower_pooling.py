"""Pools onto ember's kernels (:mod:`~ember._optimize.graph.pool_node`), in every form torch records them (module,
function, ATen operator): max pools (``FusedMaxPool``) with a ReLU that feeds one taken in, average pools
(``FusedAvgPool``) and adaptive average pools (``FusedAdaptiveAvgPool``: the global pools of classifier heads and
squeeze-excitations).

A convolutional network's stem is convolution - batch norm - ReLU - max pool (ResNet, DenseNet, GoogLeNet and
Hugging Face's ResNet). ``relu(max_pool(x))`` equals ``max_pool(relu(x))`` for every input: ReLU is non-decreasing,
so the largest of the ReLUs is the ReLU of the largest, and both keep NaN (torch's ReLU and max pool propagate it).
So the ReLU moves onto the pooled values, where the pooling kernel applies it as it stores: the pass over the
convolution's output (four times the pool's for a 3x3/2 window) is gone. The ReLU must be read by the pool alone;
an in-place one, whose input other readers would see rectified, also needs its input read by it alone (and
computed in the graph: an input of the model is the caller's tensor).

The window must be known when the graph is built (ints, as every model gives them; an adaptive pool's output
size too); a pool returning its indices stays torch's.
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from ember._graph.ops import Call, call_of
from ember._graph.patterns import call_if, only_reader
from ember._optimize.graph.pool_node import FusedAdaptiveAvgPool, FusedAvgPool, FusedMaxPool


def lower_pooling(gm: fx.GraphModule) -> tuple[int, int]:
    """Replaces every pool the kernels can take with a pooling node; returns (pools, ReLUs taken in)."""
    pools = relus = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        call = call_of(node, gm)
        if call is None or not isinstance(call.operands.get("input"), fx.Node):
            continue
        x, relu = call.operands["input"], None
        fused: nn.Module | None = None
        if call.op == "max_pool2d" and not call.operands.get("return_indices"):
            window = _window(call.operands)
            if window is not None:
                x, relu = _rectified_input(gm, node, x)
                fused = FusedMaxPool(*window, relu=relu is not None, origin=node.name)
        elif call.op == "avg_pool2d":
            fused = _average(call.operands, node.name)
        elif call.op == "adaptive_avg_pool2d" and _output_size(call.operands["output_size"]):
            fused = FusedAdaptiveAvgPool(call.operands["output_size"], node.name)
        if fused is None:
            continue
        name = f"ember_pool_{index}"
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


def _average(operands: dict[str, Any], origin: str) -> FusedAvgPool | None:
    operands = {**operands, "dilation": 1}
    window = _window(operands)
    divisor = operands.get("divisor_override")
    count_include_pad = operands.get("count_include_pad", True)
    if window is None or type(count_include_pad) is not bool or not (divisor is None or type(divisor) is int):
        return None
    kernel, stride, padding, _, ceil_mode = window
    return FusedAvgPool(kernel, stride, padding, ceil_mode, count_include_pad, divisor, origin)


def _output_size(value: Any) -> bool:
    """An adaptive pool's output size known when the graph is built: an int, or a pair of ints or None."""
    if type(value) is int:
        return True
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(v is None or type(v) is int for v in value)


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
