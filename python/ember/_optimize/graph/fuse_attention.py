"""Attention onto ember's flash-attention kernel (:class:`~ember._optimize.graph.attention_node.FusedAttention`), in
either spelling the graph holds:

- a call: ``F.scaled_dot_product_attention`` (symbolic tracing, dynamo) or ``aten.scaled_dot_product_attention``
  (torch.export), which is how Hugging Face models built with their default ``attn_implementation="sdpa"`` attend;
  without dropout (eval mode passes ``dropout_p=0``), and not with a mask and ``is_causal`` both (torch refuses it);
- written out: ``scores = q @ k.transpose(-2, -1)``, optionally scaled by a constant (``* c`` or ``/ c``), optionally
  plus a mask (masks added through views of the scores, as Swin's windows add theirs, are gathered into one first:
  :mod:`~ember._optimize.graph.attention_mask`), ``p = softmax(scores, dim=-1)`` (optionally in float32 and
  converted back with ``.to``), then ``p @ v`` (``matmul`` or ``bmm``; eval-mode dropout on ``p`` is gone by then:
  remove_identities). The mask may also be a condition the scores are filled by (``scores.masked_fill(cond,
  finfo.min)``, DeBERTa's), the scale may divide k's transpose instead of the scores (``q @ (k^T / c)``, c a
  constant the graph computes, as torch.export records ``torch.tensor(d).sqrt()``), and the operands may be
  ``[batch * heads, length, features]`` for ``bmm`` where the graph views the scores as ``[batch, heads, ...]`` for
  the mask and the probabilities back (DeBERTa's again).

Every intermediate of the written-out form must be read by the next step alone: a model that keeps its attention
probabilities (``output_attentions``) keeps the graph as it was. k's transpose may be read elsewhere: the node then
takes the transposed keys as they are.

A ``contiguous`` copy of q, k or v that only a fused call reads is dropped where the graph's own operations behind
the node are the SDPA call (which reads any layout): the kernel reads the heads where they lie, features at unit
stride (Whisper and BART make each head contiguous after ``view(b, l, h, d).transpose(1, 2)``: three copies a
layer of the activations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from torch import fx, nn

from ember._graph.ops import Call, call_of, movement_of
from ember._graph.patterns import (
    call_if,
    is_dtype_read,
    is_last_dim,
    is_reshape,
    only_reader,
    recorded_shape,
    scalar_constant,
)
from ember._optimize.graph.attention_mask import gather_masks, scores_matmul, scores_zeros
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.refs import module_of
from ember._optimize.graph.rope_node import FusedRope


@dataclass
class _Attention:
    """An attention found in the graph: its operands, the nodes it replaces (in graph order, the last being the
    result), and the call's attributes."""

    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: Any
    nodes: list[fx.Node]
    scale: float | None
    causal: bool = False
    bool_mask_keeps: bool = True
    grouped: bool = False
    keys_transposed: bool = False
    repeats_heads: bool = False  # k and v are the heads Hugging Face's repeat_kv repeated (graph: `dead`)
    dead: tuple[fx.Node, ...] = ()  # nodes the fused node leaves unread, erased after it
    repeated: tuple[fx.Node, fx.Node] | None = None  # the repeat's results, which the graph's own call reads
    mask_fill: float | None = None  # the mask is a condition the graph fills the scores by, with this value
    heads: int | None = None  # [batch * heads, ...] operands, the scores viewed as [batch, heads, ...] in between
    head_views: tuple[fx.Node, ...] = ()  # those two views (their sizes are rebuilt in the graph's own operations)
    inlined: tuple[tuple[fx.Node, float], ...] = ()  # a constant scale's reader, given the scale as a number


def fuse_attention(gm: fx.GraphModule) -> int:
    """Replaces every attention the kernel can take with a fused node; returns how many."""
    gather_masks(gm)  # (Swin's window masks, added through views of the scores: one mask first)
    fused = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        if node.graph is not gm.graph:  # erased by an earlier match
            continue
        call = call_of(node, gm)
        if call is None:
            continue
        found = None
        if call.op == "scaled_dot_product_attention":
            found = _called(node, call)
        elif call.op == "matmul":
            found = _written_out(node, call, gm)
        if found is not None and _install(gm, found, f"ember_fusedattention_{index}"):
            fused += 1
    _ropes_for_attention(gm)
    _heads_where_they_lie(gm)
    _queries_scaled_in_the_kernel(gm)
    gm.recompile()
    return fused


def _queries_scaled_in_the_kernel(gm: fx.GraphModule) -> None:
    """Takes a multiplication of a fused attention's queries by a number into the attention (``query_scale``), where
    nothing else reads the scaled queries but for their sizes and dtype: torchvision's Swin scales q, a pass over it
    between the projection and the attention, which the kernel does in its scale for nothing."""
    for node in list(gm.graph.nodes):
        fused = module_of(node, gm)
        if not isinstance(fused, FusedAttention) or fused.query_scale is not None or not node.args:
            continue
        scaled = node.args[0]
        call = call_of(scaled, gm) if isinstance(scaled, fx.Node) else None
        if call is None or call.op != "mul" or fused.repeats_heads:
            continue
        a, b = call.operands.get("input"), call.operands.get("other")
        x, factor = (a, b) if isinstance(a, fx.Node) else (b, a)
        if not isinstance(x, fx.Node) or not isinstance(factor, (int, float)) or isinstance(factor, bool):
            continue
        others = [u for u in scaled.users if u is not node]
        if scaled in node.args[1:] or not all(_reads_metadata(u) for u in others):
            continue  # (the scaled queries read as values elsewhere)
        fused.query_scale = float(factor)
        scaled.replace_all_uses_with(x)  # (the others read its sizes and dtype: x's, a number keeping the dtype)
        gm.graph.erase_node(scaled)


def _reads_metadata(node: fx.Node) -> bool:
    """A node that reads only the sizes and dtype of its tensor operands (zeros of the scores' shape, a size)."""
    if node.op == "call_function" and node.target is scores_zeros:
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.split(".")[0] in ("size", "sym_size", "dim")


def _heads_where_they_lie(gm: fx.GraphModule) -> None:
    """Drops each ``contiguous`` copy of an operand that a fused attention alone reads, where the node's fallback
    reads that operand in the SDPA call only (any layout)."""
    for node in list(gm.graph.nodes):
        fused = module_of(node, gm)
        if not isinstance(fused, FusedAttention):
            continue
        for position, operand in enumerate(node.args[:3]):
            copy = movement_of(operand) == "contiguous" and len(operand.args) == 1  # (into the default layout)
            if copy and len(operand.users) == 1 and _sdpa_reads(fused.original, position):
                node.replace_input_with(operand, operand.args[0])
                gm.graph.erase_node(operand)


def _sdpa_reads(original: fx.GraphModule, position: int) -> bool:
    """Whether the ``position``-th input of a fused attention's own operations is read by SDPA calls alone."""
    placeholders = [n for n in original.graph.nodes if n.op == "placeholder"]
    if position >= len(placeholders) or not placeholders[position].users:
        return False
    return all(
        (call := call_of(user, original)) is not None and call.op == "scaled_dot_product_attention"
        for user in placeholders[position].users
    )


def _ropes_for_attention(gm: fx.GraphModule) -> None:
    """Marks each fused rotary embedding that only fused attention nodes read, as their query or key
    (:attr:`FusedRope.for_attention`)."""
    for node in gm.graph.nodes:
        rope = module_of(node, gm)
        if not isinstance(rope, FusedRope) or not node.users:
            continue
        rope.for_attention = all(
            isinstance(module_of(user, gm), FusedAttention) and node in user.args[:2] and node not in user.args[2:]
            for user in node.users
        )


def _called(node: fx.Node, call: Call) -> _Attention | None:
    o = call.operands
    q, k, v, mask = o["input"], o["key"], o["value"], o.get("attn_mask")
    if not all(isinstance(t, fx.Node) for t in (q, k, v)) or not (mask is None or isinstance(mask, fx.Node)):
        return None
    dropout, causal, scale, grouped = (
        o.get("dropout_p", 0.0),
        o.get("is_causal", False),
        o.get("scale"),
        o.get("enable_gqa", False),
    )
    if dropout != 0 or not isinstance(causal, bool) or not isinstance(grouped, bool):
        return None
    if causal and mask is not None:  # torch raises on this; so will the graph's own call
        return None
    if scale is not None and not isinstance(scale, (int, float)):
        return None
    found = _Attention(q, k, v, mask, [node], None if scale is None else float(scale), causal, True, grouped)
    k_heads, v_heads = _repeated_heads(k), _repeated_heads(v)
    if not grouped and k_heads is not None and v_heads is not None:
        found.repeated = (k, v)
        found.k, found.v = k_heads[0], v_heads[0]
        found.grouped = found.repeats_heads = True
        found.dead = (*k_heads[1], *v_heads[1])
    return found


_MAX_END = 2**63 - 1  # torch.export's end of a slice to the end


def _repeated_heads(node: Any) -> tuple[fx.Node, list[fx.Node]] | None:
    """Where Hugging Face's repeat_kv made ``node`` (``x[:, :, None].expand(b, g, n, l, d).reshape(b, g * n, l,
    d)``, in torch.export's ATen form, the rank known from the graph): x, and the chain's nodes from ``node`` back
    (each read by the next alone). The attention then reads x's g heads as groups of n query heads, without the
    copy the reshape makes."""
    if not isinstance(node, fx.Node) or str(node.target) not in ("aten.reshape.default", "aten.view.default"):
        return None
    if len(node.users) != 1:
        return None
    chain = [node]
    current = node.args[0]
    if not isinstance(current, fx.Node) or str(current.target) != "aten.expand.default":
        return None
    unsqueezed = False
    while isinstance(current, fx.Node) and len(current.users) == 1 and current.op == "call_function":
        target, args = str(current.target), current.args
        if target == "aten.unsqueeze.default" and args[1] == 2 and not unsqueezed:
            unsqueezed = True
        elif not (_full_slice(target, args) or (target == "aten.expand.default" and len(chain) == 1)):
            break
        chain.append(current)
        current = args[0]
    if not unsqueezed or not isinstance(current, fx.Node):
        return None
    return (current, chain) if _repeats(current, chain[1], node) else None


def _full_slice(target: str, args: tuple[Any, ...]) -> bool:
    """Whether an ATen slice takes its whole dimension (``x[:, :, None]`` records them)."""
    return (
        target == "aten.slice.Tensor" and args[2:3] in ((), (0,), (None,)) and args[3:4] in ((), (_MAX_END,), (None,))
        and args[4:5] in ((), (1,))
    )  # fmt: skip


def _repeats(source: fx.Node, expand: fx.Node, result: fx.Node) -> bool:
    """Whether the recorded shapes say ``result`` is ``source`` [b, g, l, d] with each head repeated n times."""
    src, wide, out = (getattr(n.meta.get("val"), "shape", None) for n in (source, expand, result))
    if src is None or wide is None or out is None:
        return False
    if len(src) != 4 or len(wide) != 5 or len(out) != 4:
        return False
    groups, repeats = wide[1], wide[2]
    if not isinstance(repeats, int):
        return False
    # Sizes compared as torch.export printed them: symbols (s25) or numbers, which equal sizes print alike.
    same = [str(a) == str(b) for a, b in ((src[0], wide[0]), (src[1], groups), (src[2], wide[3]), (src[3], wide[4]))]
    return all(same) and str(out[1]) == str(groups * repeats)


def _with_dtype_reads(nodes: list[fx.Node]) -> list[fx.Node] | None:
    """``nodes`` with the reads of their dtypes, in graph order; None where such a read is read outside them."""
    reads = [u for n in nodes for u in n.users if is_dtype_read(u)]
    inside = set(nodes) | set(reads)
    if any(not set(r.users) <= inside for r in reads):
        return None
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    return sorted(inside, key=order.__getitem__)


def _swaps_last_two(call: Call, product: fx.Node) -> bool:
    """Whether a transpose (read by the matmul ``product``) swaps its input's last two dimensions."""
    dims = {call.operands.get("dim0"), call.operands.get("dim1")}
    if dims == {-1, -2}:
        return True
    source = call.operands["input"]
    value = source.meta.get("val") if isinstance(source, fx.Node) else None
    rank = value.dim() if value is not None and hasattr(value, "dim") else None
    if rank is None and "bmm" in str(product.target):  # bmm's operands are 3-D
        rank = 3
    return rank is not None and dims in ({rank - 1, rank - 2}, {-1, rank - 2}, {rank - 1, -2})


def _written_out(out: fx.Node, call: Call, gm: fx.GraphModule) -> _Attention | None:
    # Backwards from p @ v: the optional view of the probabilities as [batch * heads, ...], the optional conversion
    # back, the softmax over the keys, the optional mask (added or filled), the optional view of the scores as
    # [batch, heads, ...], the optional constant scale, the scores matmul q @ k^T (k^T optionally scaled).
    p, v = call.operands["input"], call.operands["other"]
    if not isinstance(v, fx.Node) or not only_reader(p, out, dtype_reads=True):
        return None
    nodes = [out]
    merged = None  # the view of [batch, heads, ...] probabilities as [batch * heads, ...]
    if is_reshape(p):
        merged = p
        nodes.append(p)
        p = p.args[0]
        if not only_reader(p, merged, dtype_reads=True):
            return None
    to = call_if(p, gm, "to")
    if to is not None:
        nodes.append(p)
        p = to.operands["input"]
        if not only_reader(p, nodes[-1], dtype_reads=True):
            return None
    softmax = call_if(p, gm, "softmax")
    if softmax is None or not is_last_dim(softmax.operands.get("dim"), p):
        return None
    nodes.append(p)
    scores = softmax.operands["input"]
    if not only_reader(scores, p, dtype_reads=True):
        return None
    mask, mask_fill = None, None
    add = call_if(scores, gm, "add")
    fill = call_if(scores, gm, "masked_fill")
    if add is not None:
        if add.operands.get("alpha", 1) != 1 or add.operands.get("inplace"):
            return None
        first, second = add.operands["input"], add.operands["other"]
        # The mask is the summand that is not the scores: the one that is no scale and no q @ k^T.
        scored, mask = (first, second) if scores_matmul(first, gm) is not None else (second, first)
        if not isinstance(mask, fx.Node) or not only_reader(scored, scores, dtype_reads=True):
            return None
        nodes.append(scores)
        scores = scored
    elif fill is not None:
        mask, mask_fill = fill.operands["mask"], _fill_value(fill.operands["value"])
        if not isinstance(mask, fx.Node) or mask_fill is None:
            return None
        if not only_reader(fill.operands["input"], scores, dtype_reads=True):
            return None
        nodes.append(scores)
        scores = fill.operands["input"]
    heads, head_views = None, cast(tuple[fx.Node, ...], ())
    if merged is not None:  # the scores' [batch * heads, ...] viewed as [batch, heads, ...]: both views or neither
        heads = _heads_split(scores, merged)
        if heads is None or not only_reader(scores.args[0], scores, dtype_reads=True):
            return None
        head_views = (merged, scores)
        nodes.append(scores)
        scores = scores.args[0]
    inlined: list[tuple[fx.Node, float]] = []
    scale = 1.0
    scaled = _scaled(scores, gm)
    if scaled is not None:
        product, factor, constant = scaled
        if not only_reader(product, scores, dtype_reads=True):
            return None
        scale = factor
        inlined += constant
        nodes.append(scores)
        scores = product
    product_call = call_if(scores, gm, "matmul")
    if product_call is None:
        return None
    nodes.append(scores)
    q, k_t = product_call.operands["input"], product_call.operands["other"]
    if not isinstance(q, fx.Node) or not isinstance(k_t, fx.Node):
        return None
    keys_scaled = _scaled(k_t, gm)  # q @ (k^T / c): the scale on the keys' transpose
    if keys_scaled is not None and only_reader(k_t, scores, dtype_reads=True):
        product, factor, constant = keys_scaled
        if not only_reader(product, k_t, dtype_reads=True):
            return None
        scale *= factor
        inlined += constant
        nodes.append(k_t)
        k_t = product
    transpose = call_if(k_t, gm, "transpose")
    if (
        transpose is None
        or not _swaps_last_two(transpose, scores)
        or not isinstance(transpose.operands["input"], fx.Node)
    ):
        return None
    keys_transposed = set(k_t.users) != {nodes[-1]}
    if keys_transposed:
        if keys_scaled is not None:  # the scaled transpose is what the node would read: left to torch
            return None
        k = k_t
    else:
        nodes.append(k_t)
        k = transpose.operands["input"]
    ordered = _with_dtype_reads(nodes)
    if ordered is None:
        return None
    return _Attention(
        q, k, v, mask, ordered, scale, bool_mask_keeps=False, keys_transposed=keys_transposed, mask_fill=mask_fill,
        heads=heads, head_views=head_views, inlined=tuple(inlined),
    )  # fmt: skip


# A value the scores are filled by where their mask says so, which the kernel may add instead: added to any score
# of float32's range it gives itself (and a row filled throughout then weighs every key alike, as the fill does).
_FILL_AT_MOST = -1e30


def _fill_value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value <= _FILL_AT_MOST else None


def _scaled(node: Any, gm: fx.GraphModule) -> tuple[fx.Node, float, list[tuple[fx.Node, float]]] | None:
    """Where ``node`` multiplies or divides a tensor by a constant: the tensor, the factor it multiplies by, and
    the constant's reader given the number where the graph computes the constant (torch.export's ``torch.tensor(d)
    .sqrt()``); None otherwise."""
    scaling = call_if(node, gm, "mul", "div")
    if scaling is None or (scaling.op == "div" and scaling.operands.get("rounding_mode") is not None):
        return None
    factor, product = scaling.operands["other"], scaling.operands["input"]
    if scaling.op == "mul" and not isinstance(product, fx.Node):
        factor, product = product, factor
    inlined: list[tuple[fx.Node, float]] = []
    if isinstance(factor, fx.Node):
        value = scalar_constant(factor, gm)
        if value is None:
            return None
        inlined.append((node, value))
        factor = value
    if not isinstance(product, fx.Node) or not isinstance(factor, (int, float)) or isinstance(factor, bool):
        return None
    if factor == 0:
        return None
    return product, float(factor) if scaling.op == "mul" else 1.0 / float(factor), inlined


def _heads_split(view: Any, merged: fx.Node) -> int | None:
    """The heads where ``view`` splits the scores' ``[batch * heads, q, k]`` into ``[batch, heads, q, k]`` and
    ``merged`` joins the probabilities back into ``[batch * heads, q, k]`` (the shapes the graph records show both);
    else None."""
    if not is_reshape(view):
        return None
    shape = view.args[1] if len(view.args) == 2 and isinstance(view.args[1], (list, tuple)) else view.args[1:]
    if len(shape) != 4 or not isinstance(shape[1], int) or isinstance(shape[1], bool) or shape[1] < 1:
        return None
    scores, split = recorded_shape(view.args[0]), recorded_shape(view)
    probabilities, joined = recorded_shape(merged.args[0]), recorded_shape(merged)
    if scores is None or split is None or probabilities is None or joined is None:
        return None
    if len(scores) != 3 or len(split) != 4 or len(probabilities) != 4 or len(joined) != 3:
        return None
    same = [str(a) == str(b) for a, b in ((scores[1:], split[2:]), (split, probabilities), (joined, scores))]
    return shape[1] if all(same) and str(split[1]) == str(shape[1]) else None


def _install(gm: fx.GraphModule, found: _Attention, name: str) -> bool:
    """Puts the fused node in place of the attention's nodes and erases them; False where the operations read more
    of the graph than their operands (then nothing changes)."""
    for reader, value in found.inlined:  # (the same computation, its constant as the number it always is)
        reader.update_arg(1, value)
    original = _original(gm, found)
    if original is None:
        return False
    fused = FusedAttention(
        original, found.scale, found.causal, found.bool_mask_keeps, found.grouped, found.keys_transposed,
        found.nodes[-1].name, found.repeats_heads, found.mask_fill, found.heads,
    )  # fmt: skip
    gm.add_submodule(name, fused)
    last = found.nodes[-1]
    with gm.graph.inserting_before(last):
        node = gm.graph.call_module(name, (found.q, found.k, found.v, found.mask))
    node.meta = dict(last.meta)
    last.replace_all_uses_with(node)
    for n in reversed(found.nodes):
        gm.graph.erase_node(n)
    for n in found.dead:  # (in order from the reader back: each is unread once the one before it is gone)
        if not n.users:
            gm.graph.erase_node(n)
    return True


class _ReadsMore(Exception):
    """The operations read a value of the graph besides their operands and dtype reads."""


def _original(gm: fx.GraphModule, found: _Attention) -> fx.GraphModule | None:
    """The graph's own operations of the attention as a GraphModule of (q, k, v, mask), holding the modules they
    call (an ``nn.Softmax``)."""
    root = nn.Module()
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    # The node passes the graph's own operations k and v repeated, where it took the repeat over (FusedAttention).
    k, v = found.repeated if found.repeated is not None else (found.k, found.v)
    for name, operand in (("q", found.q), ("k", k), ("v", v), ("mask", found.mask)):
        placeholder = graph.placeholder(name)
        if isinstance(operand, fx.Node):
            env.setdefault(operand, placeholder)

    def mapped(n: fx.Node) -> fx.Node:
        if n not in env:  # a dtype read the operations make besides their operands: copied in
            if not (n.op == "call_function" and n.target is getattr):
                raise _ReadsMore(n.name)
            env[n] = graph.node_copy(n, mapped)
        return env[n]

    try:
        for n in found.nodes:
            if n in found.head_views:  # its sizes from its own operand (the graph's read its inputs' sizes)
                source = n.args[0]
                assert isinstance(source, fx.Node)  # (a reshape's first argument, checked by the match)
                env[n] = _head_view(graph, env[source], found.heads if n is found.head_views[1] else None)
            else:
                env[n] = graph.node_copy(n, mapped)
    except _ReadsMore:
        return None
    for n in found.nodes:
        if n.op == "call_module":
            name = str(n.target).replace(".", "_")
            root.add_module(name, gm.get_submodule(str(n.target)))
            env[n].target = name
    graph.output(env[found.nodes[-1]])
    return fx.GraphModule(root, graph)


def _head_view(graph: fx.Graph, x: fx.Node, heads: int | None) -> fx.Node:
    """``x`` ([batch * heads, q, k]) viewed as [batch, heads, q, k], or (heads None: x is [batch, heads, q, k]) as
    [batch * heads, q, k]."""
    rows, columns = graph.call_method("size", (x, -2)), graph.call_method("size", (x, -1))
    shape: list[Any] = [-1, heads, rows, columns] if heads is not None else [-1, rows, columns]
    return graph.call_method("view", (x, shape))
