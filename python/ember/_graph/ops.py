"""What a node of a captured graph computes, in one vocabulary whatever form torch gave it in.

The same Linear reaches graph mode's passes as a module call (``call_module``, from symbolic tracing), a functional
call (``F.linear``, from symbolic tracing of functional code or from dynamo), a tensor method (``x.relu()``), or an
ATen operator (``aten.linear.default``, from torch.export). ``call_of`` names the operation (``"linear"``, ``"conv"``,
``"relu"``, ...) and binds its operands by name: activations and weights as graph nodes (or, for a module, the
module's own tensors), attributes as values. A pass matches ``Call.op`` and reads ``Call.operands``, and so works on
every form at once.

The vocabulary (operands beyond ``input`` in brackets):

- ``linear`` (weight, bias); ``conv`` and ``conv_transpose`` (weight, bias, stride, padding, dilation, groups, and
  output_padding for the transposed one; padding_mode for a module); ``matmul`` (other); ``addmm`` (mat1, mat2,
  beta, alpha: ``input * beta + mat1 @ mat2 * alpha``, Hugging Face's Conv1D);
- ``batch_norm`` (running_mean, running_var, weight, bias, eps; only where it normalizes with its running
  statistics); ``layer_norm`` (normalized_shape, weight, bias, eps); ``rms_norm`` (normalized_shape, weight, eps;
  eps None: the input dtype's machine epsilon, as torch takes it);
- the pieces of a hand-written RMSNorm: ``to`` (dtype; only a conversion to a dtype), ``pow`` (exponent),
  ``mean`` (dim, keepdim), ``rsqrt``;
- attention: ``scaled_dot_product_attention`` (key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa), and
  the pieces of one written out: ``softmax`` (dim, dtype), ``transpose`` (dim0, dim1), ``div`` (other; a true
  division only), ``matmul`` (``bmm`` too), ``masked_fill`` (mask, value);
- the pieces of a rotary embedding: ``slice`` (dim, start, end, step; ``x[..., a:b]`` too), ``neg``, ``cat``
  (tensors, dim);
- elementwise: ``add`` (other, alpha), ``mul`` (other), ``relu``, ``gelu`` (approximate), ``silu``, ``sigmoid``,
  ``tanh``, ``hardswish``, ``hardsigmoid``, ``mish``, ``elu`` (alpha, scale, input_scale), ``leaky_relu``
  (negative_slope), ``clamp`` (min, max; ReLU6 and Hardtanh are clamps);
- pooling: ``max_pool2d`` (kernel_size, stride, padding, dilation, ceil_mode, return_indices; stride None or
  empty: the kernel's), ``avg_pool2d`` (kernel_size, stride, padding, ceil_mode, count_include_pad,
  divisor_override), ``adaptive_avg_pool2d`` (output_size);
- ``dropout`` (p, training; every dropout module and function) and ``identity`` (``nn.Identity``).

Apart from that vocabulary, :func:`movement_of` names the operations that only move elements (views, permutes,
copies, rolls, slices), which a pass reads by name alone.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ember import _compat

__all__ = ["ACTIVATIONS", "Call", "call_of", "constant", "movement_of", "writes_in_place"]

ACTIVATIONS = frozenset(
    {"relu", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "mish", "elu", "leaky_relu", "clamp"}
)


@dataclass(frozen=True)
class Call:
    """One node's operation: its name in the vocabulary above and its operands by name."""

    op: str
    operands: dict[str, Any]


# A signature: the operation's name, its parameters in positional order, and the defaults of those that have one.
Signature = tuple[str, tuple[str, ...], dict[str, Any]]

_CONV: tuple[str, ...] = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_DEFAULTS: dict[str, Any] = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
_CONV_T: tuple[str, ...] = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
_CONV_T_DEFAULTS: dict[str, Any] = {**_CONV_DEFAULTS, "output_padding": 0}
_UNARY: tuple[str, ...] = ("input", "inplace")
_BINARY: tuple[str, ...] = ("input", "other")
_MAX_POOL: tuple[str, ...] = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_MAX_POOL_DEFAULTS: dict[str, Any] = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False,
                                      "return_indices": False}  # fmt: skip
_AVG_POOL: Signature = (
    "avg_pool2d",
    ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
    {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True, "divisor_override": None},
)
_DROPOUT: Signature = ("dropout", ("input", "p", "training", "inplace"), {"p": 0.5, "training": True, "inplace": False})

# Functions as symbolic tracing and dynamo record them.
_FUNCTIONS: dict[Callable[..., Any], Signature] = {
    F.linear: ("linear", ("input", "weight", "bias"), {"bias": None}),
    F.conv1d: ("conv", _CONV, _CONV_DEFAULTS),
    F.conv2d: ("conv", _CONV, _CONV_DEFAULTS),
    F.conv3d: ("conv", _CONV, _CONV_DEFAULTS),
    F.conv_transpose1d: ("conv_transpose", _CONV_T, _CONV_T_DEFAULTS),
    F.conv_transpose2d: ("conv_transpose", _CONV_T, _CONV_T_DEFAULTS),
    F.conv_transpose3d: ("conv_transpose", _CONV_T, _CONV_T_DEFAULTS),
    F.batch_norm: (
        "batch_norm",
        ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
        {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5},
    ),
    F.layer_norm: (
        "layer_norm",
        ("input", "normalized_shape", "weight", "bias", "eps"),
        {"weight": None, "bias": None, "eps": 1e-5},
    ),
    operator.add: ("add", _BINARY, {"alpha": 1}),
    torch.add: ("add", _BINARY, {"alpha": 1}),
    operator.mul: ("mul", _BINARY, {}),
    torch.mul: ("mul", _BINARY, {}),
    operator.matmul: ("matmul", _BINARY, {}),
    torch.addmm: ("addmm", ("input", "mat1", "mat2", "beta", "alpha"), {"beta": 1, "alpha": 1}),
    torch.matmul: ("matmul", _BINARY, {}),
    torch.bmm: ("matmul", _BINARY, {}),
    operator.neg: ("neg", ("input",), {}),
    torch.neg: ("neg", ("input",), {}),
    torch.cat: ("cat", ("tensors", "dim"), {"dim": 0}),
    operator.truediv: ("div", _BINARY, {}),
    torch.div: ("div", ("input", "other", "rounding_mode"), {"rounding_mode": None}),
    torch.transpose: ("transpose", ("input", "dim0", "dim1"), {}),
    torch.masked_fill: ("masked_fill", ("input", "mask", "value"), {}),
    F.softmax: ("softmax", ("input", "dim", "_stacklevel", "dtype"), {"dim": None, "_stacklevel": 3, "dtype": None}),
    torch.softmax: ("softmax", ("input", "dim", "dtype"), {"dtype": None}),
    torch.pow: ("pow", ("input", "exponent"), {}),
    operator.pow: ("pow", ("input", "exponent"), {}),
    torch.mean: ("mean", ("input", "dim", "keepdim"), {"keepdim": False}),
    torch.rsqrt: ("rsqrt", ("input",), {}),
    torch.relu: ("relu", ("input",), {}),
    F.relu: ("relu", _UNARY, {"inplace": False}),
    F.gelu: ("gelu", ("input",), {"approximate": "none"}),
    F.silu: ("silu", _UNARY, {"inplace": False}),
    torch.sigmoid: ("sigmoid", ("input",), {}),
    F.sigmoid: ("sigmoid", ("input",), {}),
    torch.tanh: ("tanh", ("input",), {}),
    F.tanh: ("tanh", ("input",), {}),
    F.hardswish: ("hardswish", _UNARY, {"inplace": False}),
    F.hardsigmoid: ("hardsigmoid", _UNARY, {"inplace": False}),
    F.mish: ("mish", _UNARY, {"inplace": False}),
    F.elu: ("elu", ("input", "alpha", "inplace"), {"alpha": 1.0, "inplace": False}),
    F.leaky_relu: ("leaky_relu", ("input", "negative_slope", "inplace"), {"negative_slope": 0.01, "inplace": False}),
    F.relu6: ("clamp", _UNARY, {"inplace": False, "min": 0.0, "max": 6.0}),
    F.hardtanh: (
        "clamp",
        ("input", "min_val", "max_val", "inplace"),
        {"min_val": -1.0, "max_val": 1.0, "inplace": False},
    ),
    torch.clamp: ("clamp", ("input", "min", "max"), {"min": None, "max": None}),
    F.max_pool2d: ("max_pool2d", _MAX_POOL, _MAX_POOL_DEFAULTS),
    torch.max_pool2d: ("max_pool2d", _MAX_POOL[:-1], {**_MAX_POOL_DEFAULTS, "stride": ()}),
    F.avg_pool2d: _AVG_POOL,
    F.adaptive_avg_pool2d: ("adaptive_avg_pool2d", ("input", "output_size"), {}),
    F.dropout: _DROPOUT,
    F.dropout1d: _DROPOUT,
    F.dropout2d: _DROPOUT,
    F.dropout3d: _DROPOUT,
    F.alpha_dropout: ("dropout", _DROPOUT[1], {**_DROPOUT[2], "training": False}),
    F.feature_alpha_dropout: ("dropout", _DROPOUT[1], {**_DROPOUT[2], "training": False}),
}

# RMSNorm's function, where this torch has it (2.4 and later): F.rms_norm as symbolic tracing records it, torch's
# as dynamo may.
_FUNCTIONS.update({
    function: ("rms_norm", ("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None})
    for function in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)) if function is not None
})  # fmt: skip
# torch.cat's other names, where this torch has them (concat: 1.10 and later; concatenate: 2.0 and later).
_CAT_NAMES = (getattr(torch, "concat", None), getattr(torch, "concatenate", None))
_FUNCTIONS.update({f: _FUNCTIONS[torch.cat] for f in _CAT_NAMES if f is not None})

# F.scaled_dot_product_attention, where this torch has it (2.0 and later).
if hasattr(F, "scaled_dot_product_attention"):
    _FUNCTIONS[F.scaled_dot_product_attention] = (
        "scaled_dot_product_attention",
        ("input", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False},
    )

# Operands whose name in torch's signature is not the vocabulary's.
_RENAMED = {"min_val": "min", "max_val": "max", "train": "training", "query": "input"}

# Tensor methods, by name (in-place ones are the same operation; `inplace` says so).
_ELEMENTWISE_METHODS = ("relu", "sigmoid", "tanh", "add", "mul", "clamp", "pow", "rsqrt")
_METHODS: dict[str, Signature] = {
    "relu": ("relu", ("input",), {}),
    "sigmoid": ("sigmoid", ("input",), {}),
    "tanh": ("tanh", ("input",), {}),
    "add": ("add", _BINARY, {"alpha": 1}),
    "mul": ("mul", _BINARY, {}),
    "matmul": ("matmul", _BINARY, {}),
    "bmm": ("matmul", _BINARY, {}),
    "neg": ("neg", ("input",), {}),
    "div": ("div", ("input", "other", "rounding_mode"), {"rounding_mode": None}),
    "transpose": ("transpose", ("input", "dim0", "dim1"), {}),
    "masked_fill": ("masked_fill", ("input", "mask", "value"), {}),
    "softmax": ("softmax", ("input", "dim", "dtype"), {"dtype": None}),
    "clamp": ("clamp", ("input", "min", "max"), {"min": None, "max": None}),
    "pow": ("pow", ("input", "exponent"), {}),
    "mean": ("mean", ("input", "dim", "keepdim"), {"keepdim": False}),
    "rsqrt": ("rsqrt", ("input",), {}),
    "to": ("to", ("input", "dtype"), {}),
    "float": ("to", ("input",), {"dtype": torch.float32}),
}
_METHODS.update({f"{name}_": (op, params, {**defaults, "inplace": True}) for name, (op, params, defaults) in
                 list(_METHODS.items()) if name in _ELEMENTWISE_METHODS})  # fmt: skip

# ATen operators (torch.export), by overload name; their operands are named by the operator's schema ("self" is
# called "input"), and renamed where the schema's names differ from the vocabulary's.
_ATEN: dict[str, tuple[str, dict[str, str]]] = {
    "aten.linear.default": ("linear", {}),
    "aten.conv1d.default": ("conv", {}),
    "aten.conv2d.default": ("conv", {}),
    "aten.conv3d.default": ("conv", {}),
    "aten.conv_transpose1d.default": ("conv_transpose", {}),
    "aten.conv_transpose2d.input": ("conv_transpose", {}),
    "aten.conv_transpose3d.input": ("conv_transpose", {}),
    "aten.batch_norm.default": ("batch_norm", {}),
    "aten._native_batch_norm_legit_no_training.default": ("batch_norm", {}),
    "aten.layer_norm.default": ("layer_norm", {}),
    "aten.rms_norm.default": ("rms_norm", {}),
    "aten.to.dtype": ("to", {}),
    "aten._to_copy.default": ("to", {}),
    "aten.pow.Tensor_Scalar": ("pow", {}),
    "aten.mean.dim": ("mean", {}),
    "aten.rsqrt.default": ("rsqrt", {}),
    "aten.add.Tensor": ("add", {}),
    "aten.mul.Tensor": ("mul", {}),
    "aten.matmul.default": ("matmul", {}),
    "aten.bmm.default": ("matmul", {"mat2": "other"}),
    "aten.slice.Tensor": ("slice", {}),
    "aten.neg.default": ("neg", {}),
    "aten.cat.default": ("cat", {}),
    "aten.div.Tensor": ("div", {}),
    "aten.transpose.int": ("transpose", {}),
    "aten.masked_fill.Scalar": ("masked_fill", {}),
    "aten.softmax.int": ("softmax", {}),
    "aten._softmax.default": ("softmax", {}),
    "aten.scaled_dot_product_attention.default": ("scaled_dot_product_attention", _RENAMED),
    "aten.addmm.default": ("addmm", {}),
    "aten.relu.default": ("relu", {}),
    "aten.relu_.default": ("relu", {}),
    "aten.gelu.default": ("gelu", {}),
    "aten.silu.default": ("silu", {}),
    "aten.sigmoid.default": ("sigmoid", {}),
    "aten.tanh.default": ("tanh", {}),
    "aten.hardswish.default": ("hardswish", {}),
    "aten.hardsigmoid.default": ("hardsigmoid", {}),
    "aten.mish.default": ("mish", {}),
    "aten.elu.default": ("elu", {}),
    "aten.leaky_relu.default": ("leaky_relu", {}),
    "aten.hardtanh.default": ("clamp", _RENAMED),
    "aten.clamp.default": ("clamp", {}),
    "aten.max_pool2d.default": ("max_pool2d", {}),
    "aten.avg_pool2d.default": ("avg_pool2d", {}),
    "aten.adaptive_avg_pool2d.default": ("adaptive_avg_pool2d", {}),
    "aten.dropout.default": ("dropout", _RENAMED),
    "aten.feature_dropout.default": ("dropout", _RENAMED),
    "aten.alpha_dropout.default": ("dropout", _RENAMED),
}


def call_of(node: fx.Node, root: nn.Module) -> Call | None:
    """The operation ``node`` computes and its operands, or None when it is none of the vocabulary's (or cannot be
    read: unexpected arguments, a module in training mode)."""
    try:
        call = _call_in_any_form(node, root)
    except (TypeError, AttributeError):
        return None
    if call is not None and call.op == "batch_norm" and call.operands.get("training", False) is not False:
        return None  # normalizes with the batch's statistics, in every form
    return call


def _call_in_any_form(node: fx.Node, root: nn.Module) -> Call | None:
    if node.op == "call_module":
        return _module_call(node, root.get_submodule(str(node.target)))
    if node.op == "call_method":
        signature = _METHODS.get(str(node.target))
        return _bound(signature, node.args, node.kwargs) if signature else None
    if node.op == "call_function":
        if (schema := _compat.operator_schema(node.target)) is not None:
            return _aten_call(node, schema)
        if node.target is operator.getitem:
            return _last_dim_slice(node)
        signature = _FUNCTIONS.get(node.target)  # type: ignore[arg-type]
        return _bound(signature, node.args, node.kwargs) if signature else None
    return None


def _last_dim_slice(node: fx.Node) -> Call | None:
    """``x[..., start:end]`` (symbolic tracing's getitem) as a ``slice`` of the last dimension."""
    if len(node.args) != 2 or node.kwargs:
        return None
    index: Any = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis and isinstance(index[1], slice)):
        return None
    part: slice = index[1]
    return Call("slice", {"input": node.args[0], "dim": -1, "start": part.start, "end": part.stop,
                          "step": 1 if part.step is None else part.step})  # fmt: skip


def constant(value: Any, root: nn.Module) -> torch.Tensor | None:
    """The tensor an operand holds when it is fixed for the graph's life (a module's tensor, or a ``get_attr`` node
    naming a parameter or buffer of ``root``); None for anything computed from the inputs."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, fx.Node) and value.op == "get_attr":
        found: Any = root
        for part in str(value.target).split("."):
            found = getattr(found, part)
        return found if isinstance(found, torch.Tensor) else None
    return None


def _bound(signature: Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
    op, parameters, defaults = signature
    if len(args) > len(parameters) or not set(kwargs) <= set(parameters) | set(defaults):
        return None
    operands = {**defaults, **dict(zip(parameters, args)), **kwargs}
    if not set(parameters) <= set(operands):
        return None
    return Call(op, {_RENAMED.get(name, name): value for name, value in operands.items()})


def _aten_call(node: fx.Node, schema: Any) -> Call | None:
    target = str(node.target)
    entry = _ATEN.get(target)
    if entry is None:
        return None
    op, renames = entry
    operands: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        name = renames.get(argument.name, "input" if argument.name == "self" else argument.name)
        if index < len(node.args):
            operands[name] = node.args[index]
        elif argument.name in node.kwargs:
            operands[name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            operands[name] = argument.default_value
    if target.split(".")[1].endswith("_"):  # aten's in-place operators: relu_, add_, ...
        operands["inplace"] = True
    return Call(op, operands)


def _module_call(node: fx.Node, module: nn.Module) -> Call | None:
    if len(node.args) != 1 or node.kwargs:
        return None
    x = node.args[0]
    kind = type(module)
    if kind is nn.Linear:
        return Call("linear", {"input": x, "weight": module.weight, "bias": module.bias})
    if kind in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        conv: Any = module
        operands = {
            "input": x, "weight": conv.weight, "bias": conv.bias, "stride": conv.stride, "padding": conv.padding,
            "dilation": conv.dilation, "groups": conv.groups, "padding_mode": conv.padding_mode,
        }  # fmt: skip
        if conv.transposed:
            return Call("conv_transpose", {**operands, "output_padding": conv.output_padding})
        return Call("conv", operands)
    if kind in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
        norm: Any = module
        # The batch's statistics when training or keeping none, as the module's own forward decides.
        training = norm.training or norm.running_mean is None or norm.running_var is None
        return Call("batch_norm", {
            "input": x, "running_mean": norm.running_mean, "running_var": norm.running_var, "weight": norm.weight,
            "bias": norm.bias, "eps": norm.eps, "training": training,
        })  # fmt: skip
    if isinstance(module, nn.LayerNorm) and kind is nn.LayerNorm:
        return Call("layer_norm", {
            "input": x, "normalized_shape": module.normalized_shape, "weight": module.weight, "bias": module.bias,
            "eps": module.eps,
        })  # fmt: skip
    if kind is getattr(nn, "RMSNorm", None):
        rms: Any = module
        return Call("rms_norm", {
            "input": x, "normalized_shape": rms.normalized_shape, "weight": rms.weight, "eps": rms.eps,
        })  # fmt: skip
    if kind is nn.MaxPool2d:
        pool: Any = module
        return Call("max_pool2d", {
            "input": x, "kernel_size": pool.kernel_size, "stride": pool.stride, "padding": pool.padding,
            "dilation": pool.dilation, "ceil_mode": pool.ceil_mode, "return_indices": pool.return_indices,
        })  # fmt: skip
    if kind is nn.AvgPool2d:
        avg: Any = module
        return Call("avg_pool2d", {
            "input": x, "kernel_size": avg.kernel_size, "stride": avg.stride, "padding": avg.padding,
            "ceil_mode": avg.ceil_mode, "count_include_pad": avg.count_include_pad,
            "divisor_override": avg.divisor_override,
        })  # fmt: skip
    if kind is nn.AdaptiveAvgPool2d:
        adaptive: Any = module
        return Call("adaptive_avg_pool2d", {"input": x, "output_size": adaptive.output_size})
    return _activation_module(x, module)


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _activation_module(x: Any, module: nn.Module) -> Call | None:
    inplace = bool(getattr(module, "inplace", False))
    kind = type(module)
    simple = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.Hardswish: "hardswish",
              nn.Hardsigmoid: "hardsigmoid", nn.Mish: "mish"}  # fmt: skip
    if (name := simple.get(type(module))) is not None:
        return Call(name, {"input": x, "inplace": inplace})
    if isinstance(module, nn.GELU):
        return Call("gelu", {"input": x, "approximate": module.approximate})
    if isinstance(module, nn.ELU):
        return Call("elu", {"input": x, "alpha": module.alpha, "inplace": inplace})
    if isinstance(module, nn.LeakyReLU):
        return Call("leaky_relu", {"input": x, "negative_slope": module.negative_slope, "inplace": inplace})
    if isinstance(module, nn.Softmax):
        return Call("softmax", {"input": x, "dim": module.dim, "dtype": None})
    if isinstance(module, _DROPOUTS):
        return Call("dropout", {"input": x, "p": module.p, "training": module.training})
    if kind is nn.Identity:
        return Call("identity", {"input": x})
    if isinstance(module, nn.Hardtanh):  # ReLU6 is a Hardtanh(0, 6)
        return Call("clamp", {"input": x, "min": module.min_val, "max": module.max_val, "inplace": inplace})
    return None


# Operations that only move the elements of their first argument, as tensor methods, functions and ATen operators.
_MOVING_METHODS = frozenset({"view", "reshape", "permute", "transpose", "contiguous", "clone", "flatten", "unflatten",
                             "roll", "narrow", "squeeze", "unsqueeze"})  # fmt: skip
_MOVING_FUNCTIONS = {torch.reshape: "reshape", torch.permute: "permute", torch.transpose: "transpose",
                     torch.flatten: "flatten", torch.roll: "roll", torch.narrow: "narrow", torch.squeeze: "squeeze",
                     torch.unsqueeze: "unsqueeze", torch.clone: "clone"}  # fmt: skip
_MOVING_ATEN = frozenset({"view", "_unsafe_view", "reshape", "permute", "transpose", "contiguous", "clone", "flatten",
                          "unflatten", "roll", "slice", "narrow", "squeeze", "unsqueeze", "alias"})  # fmt: skip


# A pad's ATen forms (F.pad itself is a function of torch.nn.functional).
_PADS = ("aten.pad.default", "aten.constant_pad_nd.default")


def is_pad(node: fx.Node) -> bool:
    """``F.pad`` in any of its spellings (its operands: input, pad, then mode and value, or value alone for
    ``constant_pad_nd``)."""
    return node.op == "call_function" and (node.target is F.pad or str(node.target) in _PADS)


def movement_of(node: Any) -> str | None:
    """The name of the data movement ``node`` makes of its first argument (``"view"``, ``"permute"``, ``"roll"``,
    ``"contiguous"``, ``"slice"`` for ``x[a:b]``, ...; the ATen operator's name for its forms), or None for any other
    operation, and for a copy into another memory format (``contiguous(memory_format=...)``)."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.kwargs.get("memory_format") is not None:
        return None
    if node.op == "call_method":
        return node.target if node.target in _MOVING_METHODS else None
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return "slice" if _slices_only(node.args[1]) else None
    if node.target in _MOVING_FUNCTIONS:
        return _MOVING_FUNCTIONS[node.target]
    schema = _compat.operator_schema(node.target)
    name = None if schema is None else schema.name.split("::")[-1]
    return name if name in _MOVING_ATEN else None


def _slices_only(index: Any) -> bool:
    """``x[a:b, ..., None]``: slices, Ellipsis and None only (an integer index may be a tuple's, a tensor gathers)."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, slice) or p is None or p is Ellipsis for p in parts)


def writes_in_place(target: object) -> bool:
    """An ATen overload whose schema writes an argument (``aten.relu_``), or a function or method named as torch
    names its in-place forms (``torch.relu_``, ``x.add_``)."""
    schema = _compat.operator_schema(target)
    if schema is not None:
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")
