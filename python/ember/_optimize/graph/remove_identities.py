"""Operations that return their input in eval mode removed from the graph: dropout of every spelling with
``training=False`` (the module in eval mode, ``F.dropout(x, p, training=self.training)`` traced in eval mode,
``aten.dropout(x, p, False)``) or ``p=0``, torchvision's ``stochastic_depth`` likewise, and ``nn.Identity``. Besides
the call they cost, they stand between a layer and the residual add or activation after it, which the epilogue pass
can fuse only when nothing is in between.

The graph runs in eval mode only (graph/forward.py), so a dropout traced in eval mode never has to drop anything.

A pad by nothing goes too (``F.pad(x, (0, 0, 0, 0))``, as Swin pads its windows where the size divides: torch
returns a copy of x with x's strides, a pass over memory), in a graph that writes nothing in place: the copy kept a
later in-place write to x, or to the pad's result, from reaching the other, and in a graph of no such writes
nothing can tell x from its copy.

torch.export's ``aten._assert_tensor_metadata`` checks go too: torch >= 2.8 puts one before each dtype conversion
(a hand-written RMSNorm has two), where it reads the value the conversion converts, so a pass that fuses the
conversion would find it read elsewhere. Each asserts a dtype the capture saw; the fused nodes keep the graph's
dtypes (graph mode runs the rewritten graph on the sample before installing it), and the asserts return nothing.
"""

from __future__ import annotations

from torch import fx

from ember._graph.ops import call_of, is_pad, writes_in_place
from ember._optimize.graph.purity import METADATA_ONLY
from ember._optimize.graph.refs import has_hooks, module_of


def remove_identities(gm: fx.GraphModule) -> int:
    """Removes every operation above; returns how many."""
    removed = 0
    pads_are_copies = not _writes_in_place(gm)
    for node in list(gm.graph.nodes):
        padded = _padded_by_nothing(node)
        if padded is not None and pads_are_copies:
            node.replace_all_uses_with(padded)
            gm.graph.erase_node(node)
            removed += 1
            continue
        if node.op == "call_function" and str(node.target) == "aten._assert_tensor_metadata.default":
            gm.graph.erase_node(node)
            continue
        kept = _stochastic_depth_input(node)
        if kept is not None:
            node.replace_all_uses_with(kept)
            gm.graph.erase_node(node)
            removed += 1
            continue
        call = call_of(node, gm)
        if call is None or has_hooks(module_of(node, gm)):
            continue
        if call.op == "identity" or (call.op == "dropout" and _drops_nothing(call.operands)):
            node.replace_all_uses_with(call.operands["input"])
            gm.graph.erase_node(node)
            removed += 1
    gm.recompile()
    return removed


def _stochastic_depth_input(node: fx.Node) -> fx.Node | None:
    """x, where ``node`` is torchvision's ``stochastic_depth(x, p, mode, training)`` (a function its symbolic trace
    keeps as one call: EfficientNet's and ConvNeXt's residual branches) with ``training=False`` or ``p=0``: it returns
    x."""
    target = node.target
    if node.op != "call_function" or getattr(target, "__name__", "") != "stochastic_depth":
        return None
    if not str(getattr(target, "__module__", "")).startswith("torchvision.ops"):
        return None
    names = ("input", "p", "mode", "training")
    bound = dict(zip(names, node.args))
    bound.update({k: v for k, v in node.kwargs.items() if k in names})
    x, p, training = bound.get("input"), bound.get("p"), bound.get("training", True)
    if not isinstance(x, fx.Node):
        return None
    return x if training is False or (isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0) else None


def _drops_nothing(operands: dict[str, object]) -> bool:
    """A dropout traced in eval mode, or of probability 0 (torchvision 0.14's Swin calls ``F.dropout(attn, p=0.0)``
    with the default ``training=True``: every element kept, scaled by 1)."""
    p = operands.get("p")
    return operands.get("training") is False or (isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0)


def _padded_by_nothing(node: fx.Node) -> fx.Node | None:
    """x, where ``node`` pads x by nothing on every side (``F.pad`` or its ATen forms, any mode)."""
    if not is_pad(node):
        return None
    x = node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))
    pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
    if not isinstance(x, fx.Node) or not isinstance(pad, (list, tuple)) or not pad:
        return None
    return x if all(isinstance(p, int) and not isinstance(p, bool) and p == 0 for p in pad) else None


def _writes_in_place(gm: fx.GraphModule) -> bool:
    """Whether any node may write a tensor in place: an in-place function, method or ATen overload, a call with
    ``inplace=True`` (``nn.ReLU(inplace=True)``), or a module call the vocabulary does not read (anything may)."""
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):
            if writes_in_place(node.target) and str(node.target) not in METADATA_ONLY:
                return True
            call = call_of(node, gm)
            if call is not None and call.operands.get("inplace"):
                return True
        elif node.op == "call_module" and not _checks_guards(gm, node):
            call = call_of(node, gm)
            if call is None or call.operands.get("inplace"):
                return True
    return False


def _checks_guards(gm: fx.GraphModule, node: fx.Node) -> bool:
    """torch.export's check of its inputs' sizes (``_guards_fn``, a ``torch.export._unlift.GuardsFn``): it reads."""
    module = gm.get_submodule(str(node.target))
    return type(module).__name__ == "GuardsFn" and type(module).__module__.startswith("torch.export")
