"""LayerNorm and RMSNorm, with the residual add before them, onto ember's row-norm kernel
(:class:`~ember._optimize.graph.norm_node.FusedNorm`).

A norm is found in any spelling the graph holds:

- a call: ``nn.LayerNorm`` / ``nn.RMSNorm`` modules, ``F.layer_norm`` / ``F.rms_norm``, ``aten.layer_norm`` /
  ``aten.rms_norm``;
- written by hand, as Hugging Face's Llama, Mistral, Qwen2 and T5 norms (and torch.export's ATen form of them) are:
  ``h32 = h.to(float32)`` (optional), ``var = h32.pow(2).mean(-1, keepdim=True)`` (or ``h32 * h32``),
  ``n = h32 * torch.rsqrt(var + eps)`` (or ``h * ...``), then optionally ``n.to(dtype)`` and ``weight * n``.

When the normalized tensor is a sum of two computed tensors (``h = x + residual``), the add joins the norm: the
kernel reads both and normalizes the sum in one pass, and returns the sum too where anything else reads it (the
pre-norm block's residual stream). Every intermediate must be read by the norm alone; anything else reading one
keeps the graph as it was.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ember._graph.ops import Call, call_of
from ember._graph.patterns import call_if, is_dtype_read, is_reshape
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.refs import TensorOperands, has_hooks, module_of
from ember._optimize.inference.state import TensorRef


@dataclass
class _Norm:
    """A norm found in the graph: the normalized tensor (``head``), the node whose value is the result (``last``),
    the nodes from ``head`` (excluded) to ``last`` in graph order, and the operands."""

    kind: str
    head: Any
    last: fx.Node
    nodes: list[fx.Node]
    weight: Any = None
    bias: Any = None
    eps: float | None = None
    normalized_dims: int = 1
    module: nn.Module | None = None  # the norm's module, for a module call
    residual_add: fx.Node | None = None  # h = x + residual, when it joins
    refs: tuple[TensorRef | None, TensorRef | None] = field(default=(None, None))


def fuse_norms(gm: fx.GraphModule, operands: TensorOperands) -> int:
    """Replaces every norm the kernel takes with a fused node; returns how many."""
    fused = 0
    erased: set[fx.Node] = set()
    for index, node in enumerate(list(gm.graph.nodes)):
        if node in erased:
            continue
        norm = _find(node, gm, operands)
        if norm is None or not _resolve_tensors(norm, operands):
            continue
        norm.residual_add = _residual_add(norm, gm, operands)
        erased.update(_install(gm, norm, operands, f"ember_fusednorm_{index}"))
        fused += 1
    gm.recompile()
    return fused


def _find(node: fx.Node, gm: fx.GraphModule, operands: TensorOperands) -> _Norm | None:
    call = call_of(node, gm)
    if call is None:
        return None
    if call.op in ("layer_norm", "rms_norm"):
        return _called(node, call, gm)
    if call.op == "rsqrt":
        return _hand_written_rms(node, call, gm, operands)
    return None


def _called(node: fx.Node, call: Call, gm: fx.GraphModule) -> _Norm | None:
    module = module_of(node, gm)
    if has_hooks(module):
        return None
    o = call.operands
    shape = o["normalized_shape"]
    dims = 1 if isinstance(shape, int) else len(shape)
    if dims < 1 or not isinstance(o["input"], fx.Node):
        return None
    kind = "layer" if call.op == "layer_norm" else "rms"
    return _Norm(kind, o["input"], node, [node], o.get("weight"), o.get("bias"), o.get("eps"), dims, module)


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _hand_written_rms(rsqrt: fx.Node, call: Call, gm: fx.GraphModule, operands: TensorOperands) -> _Norm | None:
    # Backwards from rsqrt: var + eps, the mean of the squares over the last dimension, the squares, the input.
    shifted = call.operands["input"]
    add = call_if(shifted, gm, "add")
    if add is None or not isinstance(add.operands["other"], (int, float)) or add.operands.get("alpha", 1) != 1:
        return None
    mean_node = add.operands["input"]
    mean = call_if(mean_node, gm, "mean")
    if mean is None or mean.operands.get("dim") not in (-1, [-1], (-1,)) or mean.operands.get("keepdim") is not True:
        return None
    squares = mean.operands["input"]
    squared = _square_of(squares, gm) if mean.operands.get("dtype") is None else None
    if squared is None or any(len(n.users) != 1 for n in (shifted, mean_node, squares)):
        return None
    # Forwards from rsqrt: (h or h32) * rsqrt, then optionally .to(dtype), then optionally weight * that.
    scaled = _only_user(rsqrt)
    mul = call_if(scaled, gm, "mul")
    if scaled is None or mul is None:
        return None
    factors = {mul.operands["input"], mul.operands["other"]}
    # h32 = h.to(float32) joins the norm where nothing else reads it (in an fp32 graph torch.export reuses it for
    # every later read of h, the conversion being a no-op there: the norm then starts at h32).
    upcast = call_if(squared, gm, "to")
    is_upcast = (
        upcast is not None and upcast.operands.get("dtype") is torch.float32
        and set(squared.users) <= {squares, scaled}
    )  # fmt: skip
    head = upcast.operands["input"] if upcast is not None and is_upcast else squared
    if factors not in ({head, rsqrt}, {squared, rsqrt}):
        return None
    nodes = [*([squared] if is_upcast else []), squares, mean_node, shifted, rsqrt, scaled]
    last: fx.Node = scaled
    cast = _only_user(last)
    to = call_if(cast, gm, "to")
    if cast is not None and to is not None and _is_dtype(to.operands.get("dtype"), head):
        nodes.append(cast)
        last = cast
    weight = None
    scale = _only_user(last)
    by = call_if(scale, gm, "mul")
    if scale is not None and by is not None:
        other = by.operands["other"] if by.operands["input"] is last else by.operands["input"]
        if other is not last and operands.ref(other) is not None:
            nodes.append(scale)
            last = scale
            weight = other
    return _Norm("rms", head, last, nodes, weight, None, float(add.operands["other"]))


def _square_of(node: Any, gm: fx.GraphModule) -> Any:
    """What ``node`` squares (``t.pow(2)`` or ``t * t``), or None."""
    power = call_if(node, gm, "pow")
    if power is not None and power.operands.get("exponent") == 2:
        return power.operands["input"]
    product = call_if(node, gm, "mul")
    if product is not None and product.operands["input"] is product.operands["other"]:
        return product.operands["input"]
    return None


def _is_dtype(dtype: Any, head: Any) -> bool:
    """A conversion's target: a dtype, or the normalized tensor's own (``input_dtype = h.dtype``, which symbolic
    tracing records as a node)."""
    return isinstance(dtype, torch.dtype) or is_dtype_read(dtype, head)


def _resolve_tensors(norm: _Norm, operands: TensorOperands) -> bool:
    """Finds where the weight and bias live (the model's own tensors, of the normalized shape); False where either
    is computed in the forward."""
    refs: list[TensorRef | None] = []
    for name, operand in (("weight", norm.weight), ("bias", norm.bias)):
        if operand is None:
            refs.append(None)
            continue
        if norm.module is not None:  # a module call: its own tensors (a graph that passes tensors has no modules)
            ref = None if operands.passed_as_arguments else TensorRef(norm.module, name)
        else:
            ref = operands.ref(operand)
        t = None if ref is None else ref.get()
        if t is None or not t.is_floating_point() or t.dim() != norm.normalized_dims:
            return False
        refs.append(ref)
    norm.refs = (refs[0], refs[1])
    return True


def _residual_add(norm: _Norm, gm: fx.GraphModule, operands: TensorOperands) -> fx.Node | None:
    """The add ``h = x + residual`` that makes the normalized tensor, when it can join the norm: two tensors computed
    in the forward (not a parameter broadcast over them), alpha 1, not in place, of one shape where the graph
    records shapes."""
    call = call_if(norm.head, gm, "add")
    if call is None or call.operands.get("alpha", 1) != 1 or call.operands.get("inplace"):
        return None
    x, residual = call.operands["input"], call.operands["other"]
    for t in (x, residual):
        if not isinstance(t, fx.Node) or t.op == "get_attr" or (t.op == "placeholder" and operands.is_parameter(t)):
            return None
    shapes = [getattr(t.meta.get("val"), "shape", None) for t in (x, residual)]
    if None not in shapes and shapes[0] != shapes[1]:
        return None
    head: fx.Node = norm.head
    return head


def _outside_users(norm: _Norm, add: fx.Node) -> list[fx.Node]:
    """The nodes that read the sum besides the norm (and its reads of the sum's dtype)."""
    inside = set(norm.nodes)
    return [u for u in add.users if u not in inside and not (is_dtype_read(u, add) and set(u.users) <= inside)]


def _install(gm: fx.GraphModule, norm: _Norm, operands: TensorOperands, name: str) -> list[fx.Node]:
    """Puts the fused node in place of the norm (and its residual add); returns the nodes erased."""
    add = norm.residual_add
    x, residual = (norm.head, None) if add is None else _summands(gm, add)
    sum_readers = [] if add is None else _outside_users(norm, add)
    returns_sum = bool(sum_readers)
    original = _original(norm, returns_sum)
    bf16_readers = [u for u in norm.last.users if _reads_in_bf16(gm, u, norm.last)]
    fused = FusedNorm(
        norm.kind, norm.eps, norm.normalized_dims, norm.refs, original, add is not None, returns_sum, norm.last.name,
        bf16_copy=bool(bf16_readers), result_read=len(bf16_readers) < len(norm.last.users),
    )  # fmt: skip
    gm.add_submodule(name, fused)
    args: tuple[Any, ...] = (x, residual)
    if operands.passed_as_arguments:
        args = (*args, norm.weight, norm.bias)
    with gm.graph.inserting_before(add if add is not None else norm.nodes[0]):
        node = gm.graph.call_module(name, args)
        outputs = [gm.graph.call_function(operator.getitem, (node, i)) for i in range(fused.outputs)]
    node.meta = dict(norm.last.meta)
    result = outputs[0] if outputs else node
    for reader in bf16_readers:  # the bf16 layers read the copy the norm writes beside its result
        reader.replace_input_with(norm.last, outputs[-1])
    norm.last.replace_all_uses_with(result)
    total = outputs[1] if returns_sum else None
    erased = list(reversed(norm.nodes))
    if add is not None:
        if total is not None:
            for user in sum_readers:
                user.replace_input_with(add, total)
        erased += [u for u in add.users if u not in norm.nodes]  # its dtype reads the norm made
        erased.append(add)
    for n in erased:
        gm.graph.erase_node(n)
    return erased


def _reads_in_bf16(gm: fx.GraphModule, user: fx.Node, value: fx.Node) -> bool:
    """Whether ``user`` is a fused layer computing in bf16 whose input (not its residual) is ``value``: it would
    round that input to bf16 on every call, as each of a transformer's Q, K and V projections would. A reshape of
    ``value`` that only such layers read counts too (Hugging Face's Conv1D flattens its input's rows first)."""
    if is_reshape(user) and user.args and user.args[0] is value and user.users:
        return all(_reads_in_bf16(gm, reader, user) for reader in user.users)
    if user.op != "call_module" or not user.args or user.args[0] is not value:
        return False
    layer = gm.get_submodule(str(user.target))
    return isinstance(layer, FusedLayer) and layer.state.compute == torch.bfloat16 and user.args[1:2] != (value,)


def _summands(gm: fx.GraphModule, add: fx.Node) -> tuple[Any, Any]:
    call = call_of(add, gm)
    assert call is not None
    return call.operands["input"], call.operands["other"]


def _original(norm: _Norm, returns_sum: bool) -> fx.GraphModule:
    """The graph's own operations of the norm (and its add) as a GraphModule of (x, residual, weight, bias)."""
    graph = fx.Graph()
    inputs = {name: graph.placeholder(name) for name in ("x", "residual", "weight", "bias")}
    env: dict[fx.Node, fx.Node] = {}
    add = norm.residual_add
    head = add if add is not None else norm.head
    env[head] = graph.call_function(torch.add, (inputs["x"], inputs["residual"])) if add is not None else inputs["x"]
    for operand, placeholder in ((norm.weight, inputs["weight"]), (norm.bias, inputs["bias"])):
        if isinstance(operand, fx.Node):
            env[operand] = placeholder

    def mapped(n: fx.Node) -> fx.Node:
        if n not in env:  # head.dtype, read by a conversion of the hand-written form
            env[n] = graph.node_copy(n, mapped)
        return env[n]

    for n in norm.nodes:
        if n.op == "call_module":  # nn.LayerNorm / nn.RMSNorm: the function its forward calls
            module: Any = norm.module
            function: Any = F.layer_norm if norm.kind == "layer" else F.rms_norm
            extra = (inputs["weight"], inputs["bias"]) if norm.kind == "layer" else (inputs["weight"],)
            env[n] = graph.call_function(function, (env[head], module.normalized_shape, *extra, module.eps))
        else:
            env[n] = graph.node_copy(n, mapped)
    graph.output((env[norm.last], env[head]) if returns_sum else env[norm.last])
    return fx.GraphModule(nn.Module(), graph)
