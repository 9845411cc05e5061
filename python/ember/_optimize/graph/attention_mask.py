"""Masks added to attention scores through views of them, gathered into one mask the fused attention can take.

Swin's shifted windows (torchvision's and Hugging Face's) add their relative-position bias to the scores, then view
the scores with the windows split from the batch, add each window's mask, and view them back::

    s = q @ k^T + bias                      # [batch * windows, heads, L, L]
    s = s.view(batch, windows, heads, L, L) + window_mask[None, :, None]
    p = softmax(s.view(-1, heads, L, L), dim=-1)

Views re-index and adds add, so any such chain of views and adds between the scores and the softmax is the scores
plus one tensor: the same chain run on zeros of the scores' shape. :func:`gather_masks` rewrites the graph to
``softmax(s + mask)``, the mask computed by the chain's own operations on those zeros (``scores_zeros``), which is
the form the attention pass matches. The rewrite holds where the chain's views lead back to the scores' shape:
graphs that record shapes (torch.export, dynamo) are checked when the pass runs (a symbolic size by the example it
was traced with), and every call checks the gathered mask's shape (``scores_mask``), so a chain that ends in
another shape raises instead of computing something else (graph mode then runs the model's own forward).

A reader of a size of the chain's values (``s.size(0) // windows``) reads it from the matching value of the mask's
chain, which has the same shape. The zeros take the scores' dtype, so the mask and the sum take the dtypes the
chain gave (under bf16 autocast, an fp32 bias makes both fp32, as before); the sum rounds differently, the adds
being in another order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ember._compat import size_hint
from ember._graph.ops import call_of
from ember._graph.patterns import call_if, is_reshape, recorded_shape

_MAX_CHAIN = 8  # views and adds between the scores and the softmax; Swin's chain has four


def scores_zeros(a: torch.Tensor, b: torch.Tensor, b_transposed: bool) -> torch.Tensor:
    """Zeros of the shape and dtype of ``a @ b`` (``b_transposed``: of ``a @ b^T``), expanded (nothing allocated).
    The dtype is the one the product gets now (under autocast, autocast's), found on one row and one column."""
    row = a[(0,) * (a.dim() - 2)][:1]
    b_matrix = b[(0,) * (b.dim() - 2)]
    column = b_matrix[:1].transpose(0, 1) if b_transposed else b_matrix[:, :1]
    keys = b.shape[-2] if b_transposed else b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    dtype = torch.matmul(row, column).dtype
    return torch.zeros((), dtype=dtype, device=a.device).expand(*batch, a.shape[-2], keys)


def scores_mask(mask: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """``mask``, the chain run on ``zeros``, where it has the scores' shape; raises where the chain's views led
    elsewhere (the gathered form would then not be the graph's)."""
    if mask.shape != zeros.shape:
        raise RuntimeError(
            f"ember: the views between these attention scores and their softmax end in shape {tuple(mask.shape)}, "
            f"not the scores' {tuple(zeros.shape)}: graph mode's gathered mask does not apply"
        )
    return mask


def gather_masks(gm: fx.GraphModule) -> int:
    """Rewrites each ``softmax(chain(scores))`` whose chain of views and adds holds an add and a view or a second
    add into ``softmax(scores + mask)``; returns how many. (A single add is already the form matched.)"""
    gathered = 0
    for node in list(gm.graph.nodes):
        softmax = call_if(node, gm, "softmax")
        if softmax is None or not isinstance(softmax.operands.get("input"), fx.Node):
            continue
        found = _chain(softmax.operands["input"], node, gm)
        if found is not None:
            _rewrite(gm, node, *found)
            gathered += 1
    if gathered:
        gm.graph.lint()
        gm.recompile()
    return gathered


def _chain(last: fx.Node, softmax: fx.Node, gm: fx.GraphModule) -> tuple[list[fx.Node], fx.Node, fx.Node] | None:
    """The chain from the softmax's input back to the scores (softmax side first), the scores, and the scores'
    matmul; None where the softmax does not read such a chain."""
    chain: list[fx.Node] = []
    node, reader = last, softmax
    while len(chain) <= _MAX_CHAIN:
        if not _read_by(node, reader):
            return None
        if scores_matmul(node, gm) is not None:
            break
        source = node.args[0] if is_reshape(node) else _summand_with_scores(node, gm)
        if not isinstance(source, fx.Node):
            return None
        chain.append(node)
        node, reader = source, node
    matmul = scores_matmul(node, gm)
    adds = sum(1 for n in chain if not is_reshape(n))
    if matmul is None or adds == 0 or len(chain) < 2:
        return None
    before, after = recorded_shape(node), recorded_shape(last)
    if before is not None and after is not None and not _same_shape(before, after):
        return None  # the views lead elsewhere: the rewrite would not be the graph's computation
    return chain, node, matmul


def _same_shape(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two recorded shapes agree: sizes compared as the example the graph was traced with where they are
    symbolic (``(b // n) * n`` and ``b`` are one size there, and every call checks the mask's shape anyway)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        hx, hy = size_hint(x), size_hint(y)
        if (hx != hy) if hx is not None and hy is not None else str(x) != str(y):
            return False
    return True


def _read_by(node: fx.Node, reader: fx.Node) -> bool:
    """Whether ``reader`` reads ``node`` and every other reader reads one of its sizes."""
    if reader not in node.users:
        return False
    return all(u is reader or _size_read(u, node) for u in node.users)


def _size_read(user: fx.Node, of: fx.Node) -> bool:
    """Whether ``user`` reads one size of ``of`` (``x.size(d)``, or torch.export's ``aten.sym_size.int``)."""
    if user.args[:1] != (of,) or len(user.args) != 2 or user.kwargs:
        return False
    if user.op == "call_method":
        return user.target == "size" and isinstance(user.args[1], int)
    return user.op == "call_function" and str(user.target) == "aten.sym_size.int"


def _summand_with_scores(node: fx.Node, gm: fx.GraphModule) -> Any:
    """Where ``node`` adds a tensor to a value computed from the scores: that value; else None."""
    add = call_if(node, gm, "add")
    if add is None or add.operands.get("alpha", 1) != 1 or add.operands.get("inplace"):
        return None
    first, second = add.operands["input"], add.operands["other"]
    if _leads_to_scores(first, gm):
        return first if isinstance(second, (fx.Node, int, float)) and not _leads_to_scores(second, gm) else None
    return second if isinstance(first, fx.Node) and _leads_to_scores(second, gm) else None


def _leads_to_scores(node: Any, gm: fx.GraphModule, depth: int = _MAX_CHAIN) -> bool:
    """Whether ``node`` is the scores, or views and adds of them."""
    if not isinstance(node, fx.Node) or depth < 0:
        return False
    if scores_matmul(node, gm) is not None:
        return True
    if is_reshape(node):
        return _leads_to_scores(node.args[0], gm, depth - 1)
    add = call_if(node, gm, "add")
    return add is not None and any(_leads_to_scores(add.operands[n], gm, depth - 1) for n in ("input", "other"))


def scores_matmul(node: Any, gm: fx.GraphModule) -> fx.Node | None:
    """The ``q @ k^T`` node when ``node`` is it or a constant scale of it."""
    scaling = call_if(node, gm, "mul", "div")
    if scaling is not None:
        operand = scaling.operands["input"]
        node = scaling.operands["other"] if isinstance(operand, (int, float)) else operand
    return node if call_if(node, gm, "matmul") is not None else None


def _rewrite(gm: fx.GraphModule, softmax: fx.Node, chain: list[fx.Node], scores: fx.Node, matmul: fx.Node) -> None:
    graph = gm.graph
    product = call_of(matmul, gm)
    assert product is not None  # (found by scores_matmul)
    a, b = product.operands["input"], product.operands["other"]
    transpose = call_if(b, gm, "transpose")
    b_source, b_transposed = b, False
    if transpose is not None and {transpose.operands.get("dim0"), transpose.operands.get("dim1")} == {-1, -2}:
        b_source, b_transposed = transpose.operands["input"], True  # (so k's transpose keeps its one reader)
    with graph.inserting_after(scores):
        zeros = graph.call_function(scores_zeros, (a, b_source, b_transposed))
    for user in list(scores.users):
        if _size_read(user, scores):
            user.replace_input_with(scores, zeros)
    previous, replayed = scores, zeros
    for node in reversed(chain):
        with graph.inserting_before(node):
            copy = graph.node_copy(node, lambda n, p=previous, r=replayed: r if n is p else n)  # type: ignore[misc]
        for user in list(node.users):
            if _size_read(user, node):
                user.replace_input_with(node, copy)
        previous, replayed = node, copy
    add = next(n for n in reversed(chain) if not is_reshape(n))  # an add of the chain, for its form
    with graph.inserting_before(softmax):
        mask = graph.call_function(scores_mask, (replayed, zeros))
        total = graph.create_node(add.op, add.target, (scores, mask), {}, name=f"{add.name}_gathered")
    softmax.replace_input_with(chain[0], total)
    for node in chain:  # (softmax side first: each is unread once the one after it is gone)
        graph.erase_node(node)
