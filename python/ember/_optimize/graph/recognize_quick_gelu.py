"""The quick GELU written out, ``x * sigmoid(c * x)`` (CLIP's ``QuickGELUActivation``, c = 1.702; any constant c:
a swish with a scale), rewritten as ``silu(c * x) * (1 / c)``, the same function as three steps the epilogue pass
then fuses into the layer before it (a scale, the SiLU, a scale). Written out, the layer's output is read twice
(by the scale and by the product), which no epilogue chain takes; under torch.export it is three ATen operations,
three passes over memory the layer's epilogue does in none.

The match: a product of a node ``x`` and ``sigmoid(s)``, where ``s`` is ``x`` times a constant (either order) and
only the pattern reads ``s`` and the sigmoid. The rewrite rounds differently, as ``F.silu`` and the written form
do in eager: ``c·x·σ(c·x) / c`` in place of ``x·σ(c·x)``.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch.nn.functional as F
from torch import fx

from ember._graph.ops import call_of


def recognize_quick_gelu(gm: fx.GraphModule) -> int:
    """Rewrites every written-out ``x * sigmoid(c * x)`` as ``silu(c * x) * (1 / c)``; returns how many."""
    found = 0
    for node in list(gm.graph.nodes):
        match = _quick_gelu_of(gm, node)
        if match is None:
            continue
        scaled, sigmoid, c = match
        with gm.graph.inserting_before(node):
            silu = gm.graph.call_function(F.silu, (scaled,))
            result = gm.graph.call_function(operator.mul, (silu, 1.0 / c)) if c != 1.0 else silu
        silu.meta = dict(sigmoid.meta)
        result.meta = dict(node.meta)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        gm.graph.erase_node(sigmoid)
        found += 1
    gm.recompile()
    return found


def _quick_gelu_of(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, fx.Node, float] | None:
    """``(c·x, the sigmoid, c)`` where ``node`` is ``x * sigmoid(c * x)`` as above."""
    call = _call(gm, node, "mul")
    if call is None:
        return None
    first, second = call.operands["input"], call.operands["other"]
    for x, sigmoid in ((first, second), (second, first)):
        inner = _call(gm, sigmoid, "sigmoid")
        if inner is None or not isinstance(x, fx.Node) or set(sigmoid.users) != {node}:
            continue
        scaled = inner.operands["input"]
        scale = _call(gm, scaled, "mul")
        if scale is None or set(scaled.users) != {sigmoid}:
            continue
        a, b = scale.operands["input"], scale.operands["other"]
        c = _constant(b) if a is x else _constant(a) if b is x else None
        if c is not None:
            return scaled, sigmoid, c
    return None


def _call(gm: fx.GraphModule, node: Any, op: str) -> Any:
    """The call ``node`` makes where it is ``op``, not in place."""
    call = call_of(node, gm) if isinstance(node, fx.Node) else None
    if call is None or call.op != op or call.operands.get("inplace"):
        return None
    return call


def _constant(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    c = float(value)
    return c if math.isfinite(c) and c != 0.0 else None
