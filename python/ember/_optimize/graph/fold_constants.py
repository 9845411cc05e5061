"""Weight transforms folded: an operation whose every operand is the model's own tensor (a parameter or buffer,
or what another such operation made of them) gives the same value on every call until one of those tensors
changes, so it is computed once and kept (:class:`~ember._optimize.graph.folded_node.FoldedConstant`) rather than
on every call: ``F.linear(x, self.weight.t())``, a weight norm's ``g * v / ||v||`` (Wav2Vec2's positional
convolution), Swin's relative-position bias gathered from its table in every block, Gemma's ``1 + weight``.

Run before the lowering, so a layer whose weight is such a value is lowered: the layer reads the kept value as it
reads a parameter, and packs it again when it changes.

What folds: the operations of a list known to be deterministic, without effects and untouched by autocast (views,
dtype conversions, indexing, concatenation, elementwise arithmetic, reductions, weight norm; ATen operators that
write none of their arguments and draw no random numbers). Not folded: anything reading an input or a size of one,
anything over a tensor the graph writes in place, and a chain of views no layer reads (a view costs less than
the call that would keep it). A kept value is one more tensor of its size, the price of not computing it per call.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ember import _compat
from ember._graph.ops import call_of, writes_in_place
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.refs import TensorOperands
from ember._optimize.inference.state import TensorRef

_VIEW_FUNCTIONS = {torch.t, torch.transpose, torch.permute, torch.reshape, torch.flatten, torch.squeeze,
                   torch.unsqueeze, torch.narrow, torch.select, getattr}  # fmt: skip
_FUNCTIONS = _VIEW_FUNCTIONS | {
    torch.cat, torch.stack, torch.index_select, torch.gather, torch.add, torch.sub, torch.mul, torch.div, torch.neg,
    torch.sqrt, torch.rsqrt, torch.exp, torch.log, torch.abs, torch.clamp, torch.sigmoid, torch.tanh, torch.pow,
    torch.flip, torch.roll, torch.tril, torch.triu, torch.where, F.softplus, F.normalize,
    *_compat.weight_norm_functions, operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
    operator.neg, operator.pow,
}  # fmt: skip
_VIEW_METHODS = {"t", "transpose", "permute", "reshape", "view", "view_as", "flatten", "unflatten", "squeeze",
                 "unsqueeze", "expand", "expand_as", "narrow", "select", "detach", "size", "dim"}  # fmt: skip
_METHODS = _VIEW_METHODS | {
    "contiguous", "to", "float", "half", "bfloat16", "double", "type", "type_as", "repeat", "index_select", "gather",
    "add", "sub", "mul", "div", "neg", "sqrt", "rsqrt", "exp", "log", "abs", "clamp", "pow", "sum", "mean", "flip",
    "roll", "tril", "triu", "clone", "masked_fill", "sigmoid", "tanh",
}  # fmt: skip
_ATTRIBUTES = {"T", "mT", "shape", "dtype"}  # getattr(weight, name) of these only
# ATen operators that autocast runs in bf16 (a value folded is computed with autocast off).
_AUTOCAST_ATEN = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "conv", "_convolution", "prelu")
# Readers that take a weight: a value read only by views is folded only when one of these reads it.
_LAYERS = {"linear", "conv", "conv_transpose", "matmul", "addmm", "batch_norm", "layer_norm", "rms_norm"}


def fold_constants(gm: fx.GraphModule, operands: TensorOperands) -> int:
    """Replaces each weight transform some other operation reads by a kept value; returns how many."""
    sources = _sources(gm, operands)
    written = _written(gm, sources)
    constant = _constant_nodes(gm, sources, written)
    folded = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        readers = [user for user in node.users if user not in constant]
        if node not in constant or node in sources or not readers or not _worth_keeping(node, readers, gm, constant):
            continue
        leaves, expression = _expression(node, constant, sources)
        module = FoldedConstant(expression, tuple(sources[leaf] for leaf in leaves), node.name)
        if not isinstance(module.value, torch.Tensor):
            continue  # a size or a dtype: nothing to keep
        name = f"ember_folded_{index}"
        gm.add_submodule(name, module)
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_module(name, tuple(leaves) if operands.passed_as_arguments else ())
        replacement.meta = dict(node.meta)
        for reader in readers:
            reader.replace_input_with(node, replacement)
        folded += 1
    _erase_unread(gm, constant)
    gm.recompile()
    return folded


def _sources(gm: fx.GraphModule, operands: TensorOperands) -> dict[fx.Node, TensorRef]:
    """The model's tensors the graph reads: its ``get_attr`` nodes, or the parameters a graph passes as inputs."""
    found = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" or (node.op == "placeholder" and operands.is_parameter(node)):
            ref = operands.ref(node)
            if ref is not None and isinstance(ref.get(), torch.Tensor):
                found[node] = ref
    return found


def _written(gm: fx.GraphModule, sources: dict[fx.Node, TensorRef]) -> set[fx.Node]:
    """The sources an in-place operation of the graph writes, directly or through a view (every read of the same
    tensor: a capture may read it in several nodes): not constants."""
    written_tensors = set()
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method") and writes_in_place(node.target) and node.args:
            target = node.args[0]
            while isinstance(target, fx.Node) and target not in sources and target.all_input_nodes:
                target = target.all_input_nodes[0]  # a view's base is its first operand
            if target in sources:
                written_tensors.add(_tensor_key(target))
    return {node for node in sources if _tensor_key(node) in written_tensors}


def _tensor_key(node: fx.Node) -> object:
    return ("attribute", str(node.target)) if node.op == "get_attr" else node


def _constant_nodes(gm: fx.GraphModule, sources: dict[fx.Node, TensorRef], written: set[fx.Node]) -> set[fx.Node]:
    constant = {node for node in sources if node not in written}
    for node in gm.graph.nodes:
        inputs = node.all_input_nodes
        if inputs and all(n in constant for n in inputs) and foldable(node):
            constant.add(node)
    return constant


def foldable(node: fx.Node) -> bool:
    """An operation of the lists above: deterministic, without effects, untouched by autocast."""
    target = node.target
    if node.op == "call_method":
        return target in _METHODS
    if node.op != "call_function":
        return False
    if target is getattr:
        return len(node.args) == 2 and node.args[1] in _ATTRIBUTES
    if target in _FUNCTIONS:
        return True
    schema = _compat.operator_schema(target)
    if schema is None or writes_in_place(target) or _compat.draws_random_numbers(target):
        return False
    return schema.name.removeprefix("aten::") not in _AUTOCAST_ATEN and schema.name.startswith("aten::")


def is_view(node: fx.Node) -> bool:
    """An operation whose result is a view of its first operand."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.target in _VIEW_FUNCTIONS:
        return True
    if node.target is operator.getitem:
        return not any(isinstance(a, fx.Node) for a in node.args[1:])  # slices and integers, not a tensor index
    schema = _compat.operator_schema(node.target)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _worth_keeping(node: fx.Node, readers: list[fx.Node], gm: fx.GraphModule, constant: set[fx.Node]) -> bool:
    """Whether the value computes something beyond views of the sources, or a layer reads it (the layer is lowered
    only on a value that is kept)."""
    if any((call := call_of(reader, gm)) is not None and call.op in _LAYERS for reader in readers):
        return True
    pending, seen = [node], set()
    while pending:
        n = pending.pop()
        if n in seen or n.op in ("get_attr", "placeholder"):
            continue
        seen.add(n)
        if not is_view(n):
            return True
        pending.extend(i for i in n.all_input_nodes if i in constant)
    return False


def _expression(
    node: fx.Node, constant: set[fx.Node], sources: dict[fx.Node, TensorRef]
) -> tuple[list[fx.Node], fx.GraphModule]:
    """The operations ``node``'s value is computed by, as a GraphModule of the sources they read (in graph order)."""
    needed: set[fx.Node] = set()
    pending = [node]
    while pending:
        n = pending.pop()
        if n not in needed:
            needed.add(n)
            pending.extend(n.all_input_nodes)
    ordered = [n for n in node.graph.nodes if n in needed]
    leaves = [n for n in ordered if n in sources]
    return leaves, extract_subgraph(ordered, leaves, node, nn.Module())


def extract_subgraph(ordered: list[fx.Node], leaves: list[fx.Node], output: fx.Node, root: nn.Module) -> fx.GraphModule:
    """``ordered`` (nodes in graph order) copied into a GraphModule over ``root`` whose inputs are ``leaves`` and
    whose result is ``output``'s value: a computation a kept-value node replays."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {leaf: graph.placeholder(f"leaf_{i}") for i, leaf in enumerate(leaves)}
    for n in ordered:
        if n not in env:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[output])
    return fx.GraphModule(root, graph)


def _erase_unread(gm: fx.GraphModule, constant: set[fx.Node]) -> None:
    """The operations folding left unread (all pure: the list above), readers first."""
    for node in reversed(list(gm.graph.nodes)):
        if node in constant and not node.users and node.op != "placeholder":
            gm.graph.erase_node(node)
