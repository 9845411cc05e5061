"""A conversion to float32 whose only readers are bf16 layers taken into those layers, where it costs nothing.

Hugging Face's T5 (and its relatives: mT5, UMT5, LongT5) converts the MLP's hidden activation to the output
projection's weight dtype before it, ``h.to(self.wo.weight.dtype)``: float32, as ember leaves the model's weights.
Under ember's bf16 the layer before writes bf16, the conversion writes it again as float32 (twice the bytes), and the
bf16 layer after it rounds that back to bf16: two passes over the activation that give back the value they read,
since bfloat16 -> float32 is exact and float32 -> bfloat16 of such a value is the value. T5-small does this twelve
times a forward on ``[batch, 128, 2048]``.

The pass drops such a conversion (``x.to(torch.float32)``, ``x.float()``, ``aten.to.dtype``, ``aten._to_copy`` with
a dtype alone) when every reader is a fused layer computing in bf16 that reads it as its input, and marks those
layers (``FusedLayer.input_cast``): a layer given a bf16 input reads it as it is on its bf16 kernel, and converts it
first on any other path (torch's operations, another compute dtype, another input dtype), as the graph did.
"""

from __future__ import annotations

import torch
from torch import fx

from ember._graph.ops import call_of
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.refs import module_of

# Operands of a conversion that leave it a conversion of dtype alone when they have these values.
_PLAIN = {"non_blocking": (False,), "copy": (False,), "memory_format": (None, torch.preserve_format), "layout": (None,),
          "device": (None,), "pin_memory": (None, False)}  # fmt: skip


def absorb_casts(gm: fx.GraphModule) -> int:
    """Takes every conversion described above into its readers; returns how many."""
    absorbed = 0
    for node in list(gm.graph.nodes):
        value = _converted_to_float32(gm, node)
        if value is None or not node.users:
            continue
        readers = [module_of(user, gm) for user in node.users]
        if not all(_bf16_layer_reading(user, reader, node) for user, reader in zip(node.users, readers)):
            continue
        for reader in readers:
            reader.input_cast = torch.float32  # type: ignore[union-attr]  # (checked above)
        node.replace_all_uses_with(value)
        gm.graph.erase_node(node)
        absorbed += 1
    gm.recompile()
    return absorbed


def _converted_to_float32(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The value ``node`` converts to float32 and does nothing else to, or None."""
    call = call_of(node, gm)
    if call is None or call.op != "to" or call.operands.get("dtype") is not torch.float32:
        return None
    value = call.operands.get("input")
    if not isinstance(value, fx.Node):
        return None
    for name, operand in call.operands.items():
        if name not in ("input", "dtype") and (name not in _PLAIN or operand not in _PLAIN[name]):
            return None
    return value


def _bf16_layer_reading(user: fx.Node, reader: object, converted: fx.Node) -> bool:
    """Whether ``user`` calls a fused layer computing in bf16 whose input, and nothing else, is ``converted``."""
    if not isinstance(reader, FusedLayer) or reader.state.compute != torch.bfloat16:
        return False
    args = user.args
    return bool(args) and args[0] is converted and all(a is not converted for a in (*args[1:], *user.kwargs.values()))
