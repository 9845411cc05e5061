"""The tanh GELU written out as arithmetic, ``0.5 * x * (1 + tanh(√(2/π) * (x + 0.044715 * x³)))``, replaced by the
one call it computes, ``F.gelu(x, approximate="tanh")``, which the epilogue pass then fuses into the layer before
it. Hugging Face writes it so in ``NewGELUActivation`` (GPT-2, GPT-J, CodeGen, ...) and ``FastGELUActivation``, and
Megatron-style code in its own association of the same products; under torch.export each is eight ATen operations,
seven passes over memory that the layer's epilogue does in none.

The match is algebraic rather than textual, so any association and operand order matches: the ``tanh``'s argument
is evaluated as a polynomial in one node ``x`` through the ``mul``, ``add`` and integer ``pow`` nodes that only the
pattern reads, and must be ``c·x + c·0.044715·x³`` with ``c = √(2/π)`` (to the 1e-6 the models' written constants
have); the result must be the product of 0.5, that ``x`` and ``1 + tanh(...)``. An intermediate value read outside
the pattern keeps it (it would have to be computed anyway).

The replacement computes the same function in one rounding where the graph rounded at each of its operations:
under bf16, results differ by those roundings, as between ``F.gelu(x, approximate="tanh")`` and the written form in
eager.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import fx

from ember._graph.ops import call_of

_C1 = math.sqrt(2.0 / math.pi)
_C3 = _C1 * 0.044715
_RTOL = 1e-6

Polynomial = dict[int, float]  # power of x -> coefficient


def recognize_gelu(gm: fx.GraphModule) -> int:
    """Replaces every written-out tanh GELU with ``F.gelu(x, approximate="tanh")``; returns how many."""
    found = 0
    erased: set[fx.Node] = set()
    for node in reversed(list(gm.graph.nodes)):
        if node in erased:
            continue
        match = _gelu_of(gm, node)
        if match is None:
            continue
        x, inside = match
        with gm.graph.inserting_before(node):
            gelu = gm.graph.call_function(F.gelu, (x,), {"approximate": "tanh"})
        gelu.meta = dict(node.meta)
        node.replace_all_uses_with(gelu)
        for n in sorted(inside, key=_position(gm), reverse=True):  # each after its readers
            gm.graph.erase_node(n)
        erased |= inside
        found += 1
    gm.recompile()
    return found


def _position(gm: fx.GraphModule) -> Any:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return lambda n: order[n]


def _gelu_of(gm: fx.GraphModule, result: fx.Node) -> tuple[fx.Node, set[fx.Node]] | None:
    """``(x, the pattern's nodes)`` when ``result`` is ``0.5 * x * (1 + tanh(u(x)))`` as above."""
    if _op(gm, result) != "mul":
        return None
    inside: set[fx.Node] = {result}
    factors: list[Any] = []
    _flatten(gm, result, factors, inside, root=True)
    scalars = [f for f in factors if not isinstance(f, fx.Node)]
    nodes = [f for f in factors if isinstance(f, fx.Node)]
    if len(nodes) != 2 or not math.isclose(math.prod(scalars), 0.5, rel_tol=_RTOL):
        return None
    for x, one_plus in (nodes, nodes[::-1]):
        tanh = _one_plus_tanh(gm, one_plus)
        if tanh is None or not _private(tanh, {one_plus}) or not _private(one_plus, inside):
            continue
        argument = call_of(tanh, gm).operands["input"]  # type: ignore[union-attr]
        used = {one_plus, tanh}
        poly = _polynomial(gm, argument, x, used | inside, used)
        if poly is not None and _is_gelu_argument(poly):
            return x, inside | used
    return None


def _op(gm: fx.GraphModule, node: Any) -> str | None:
    call = call_of(node, gm) if isinstance(node, fx.Node) else None
    if call is None or call.operands.get("inplace") or (call.op == "add" and call.operands.get("alpha", 1) != 1):
        return None
    return call.op


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _private(node: fx.Node, readers: set[fx.Node]) -> bool:
    """Whether only ``readers`` read ``node``."""
    return all(u in readers for u in node.users)


def _flatten(gm: fx.GraphModule, node: Any, factors: list[Any], inside: set[fx.Node], root: bool = False) -> None:
    """The factors of a product tree: its scalar operands and the nodes that are not single-reader products."""
    if _scalar(node) is not None:
        factors.append(_scalar(node))
        return
    single = isinstance(node, fx.Node) and len(node.users) == 1
    if isinstance(node, fx.Node) and _op(gm, node) == "mul" and (root or single):
        inside.add(node)
        call = call_of(node, gm)
        assert call is not None
        _flatten(gm, call.operands["input"], factors, inside)
        _flatten(gm, call.operands["other"], factors, inside)
        return
    factors.append(node)


def _one_plus_tanh(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The ``tanh`` node of ``1 + tanh(u)`` (either order)."""
    if _op(gm, node) != "add":
        return None
    call = call_of(node, gm)
    assert call is not None
    for one, t in ((call.operands["input"], call.operands["other"]), (call.operands["other"], call.operands["input"])):
        if _scalar(one) == 1.0 and isinstance(t, fx.Node) and _op(gm, t) == "tanh":
            return t
    return None


def _polynomial(
    gm: fx.GraphModule, value: Any, x: fx.Node, readers: set[fx.Node], used: set[fx.Node]
) -> Polynomial | None:
    """``value`` as a polynomial in ``x`` through arithmetic nodes only ``readers`` read (each added to ``used`` and
    ``readers``), or None."""
    if value is x:
        return {1: 1.0}
    if (c := _scalar(value)) is not None:
        return {0: c}
    if not isinstance(value, fx.Node) or not _private(value, readers):
        return None
    op = _op(gm, value)
    if op not in ("mul", "add", "pow"):
        return None
    call = call_of(value, gm)
    assert call is not None
    used.add(value)
    readers.add(value)
    left = _polynomial(gm, call.operands["input"], x, readers, used)
    if left is None:
        return None
    if op == "pow":
        exponent = call.operands.get("exponent")
        if _scalar(exponent) not in (2.0, 3.0):
            return None
        return _times(left, left) if exponent == 2 else _times(_times(left, left), left)
    right = _polynomial(gm, call.operands["other"], x, readers, used)
    if right is None:
        return None
    if op == "mul":
        return _times(left, right)
    return {p: left.get(p, 0.0) + right.get(p, 0.0) for p in set(left) | set(right)}


def _times(a: Polynomial, b: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for p, c in a.items():
        for q, d in b.items():
            out[p + q] = out.get(p + q, 0.0) + c * d
    return out


def _is_gelu_argument(poly: Polynomial) -> bool:
    """Whether ``poly`` is √(2/π)·(x + 0.044715·x³)."""
    terms = {p: c for p, c in poly.items() if c != 0.0}
    return (
        set(terms) == {1, 3}
        and math.isclose(terms[1], _C1, rel_tol=_RTOL)
        and math.isclose(terms[3], _C3, rel_tol=_RTOL)
    )
