"""Properties of ember's attention kernel as Python reaches it (``ember._C.scaled_dot_product_attention``, which graph
mode's fused attention calls): on any operands a caller can build (every dtype, odd shapes, heads that do not
group, masks of any dtype and broadcast, odd layouts, an output that is wrong or overlaps an input; a few queries
against many keys, the few-query path), the result is a float64 reference's within the dtype's tolerance, or a clear
exception before anything is written."""

from __future__ import annotations

import math
from typing import Any

import torch
from fuzz import ALL_DTYPES, call_or_refuse, layouts, special_floats, tensors
from hypothesis import given
from hypothesis import strategies as st

from ember import _C
from ember._tensor import dlpack

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _exports_bool() -> bool:
    """Whether this torch hands a bool tensor to DLPack (torch 1.13 refuses: there is no bool mask to pass)."""
    try:
        dlpack(torch.ones(1, dtype=torch.bool))
    except RuntimeError:
        return False
    return True


_MASK_DTYPES = (torch.bool, torch.float32, torch.bfloat16) if _exports_bool() else (torch.float32, torch.bfloat16)


def _reference(q: Any, k: Any, v: Any, mask: Any, causal: bool, scale: float) -> torch.Tensor:
    """The definition in float64; a query row with every key masked gives zeros."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else mask.double())
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    p = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return p @ v


@st.composite
def _calls(draw: Any) -> dict[str, Any]:

    def rarely() -> bool:  # one call in ten: a wrong argument (or an empty size) of this kind
        return draw(st.integers(0, 9)) == 0

    def size(most: int) -> int:
        return 0 if rarely() else draw(st.integers(1, most))

    batch, heads_kv, group = size(2), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    # Half the calls take at most 4 queries (the few-query path), and one in four keys past the 256 of a key block or
    # chunk (several chunks merged, the AMX path's blocks).
    queries = size(4) if draw(st.booleans()) else size(70)
    keys = draw(st.integers(200, 700)) if draw(st.integers(0, 3)) == 0 else size(70)
    dim, dim_v = size(40), size(40)

    heads = heads_kv * group + int(rarely())  # a count that does not group
    special = rarely()
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def operand(shape: list[int], dtypes: Any) -> torch.Tensor:
        # Mostly as a projection split into heads lays it out ([b, l, h, e] memory); now and then in a layout the
        # kernel refuses (the features strided) or takes (expanded, transposed elsewhere).
        odd = rarely()
        if special:  # NaN, infinities, huge and tiny values, in drawn layouts
            t = draw(tensors(shape, dtypes, special_floats(), odd_layouts=odd))
        else:  # hypothesis would draw mostly zeros, under which every key scores the same
            dtype = draw(st.sampled_from(list(dtypes)))
            t = draw(layouts(torch.randn(shape, generator=generator).clamp(-3, 3).to(dtype))) if odd else None
            t = t if t is not None else torch.randn(shape, generator=generator).clamp(-3, 3).to(dtype)
        if not odd and draw(st.booleans()):
            t = t.transpose(1, 2).contiguous().transpose(1, 2)
        return t

    q = operand([batch, heads, queries, dim], ALL_DTYPES if rarely() else _KERNEL_DTYPES)
    k = operand([batch, heads_kv, keys, dim + int(rarely())], [q.dtype])
    v = operand([batch, heads_kv, keys, dim_v], [torch.float64] if rarely() else [q.dtype])
    mask = None
    if draw(st.booleans()):
        full = [batch, heads, queries, keys]
        sizes = [s if draw(st.booleans()) else 1 for s in full][draw(st.integers(0, 3)) :]
        if rarely() and sizes:
            sizes[-1] += 1  # does not broadcast
        mask_dtypes = (torch.float64, torch.int32) if rarely() else _MASK_DTYPES
        mask_dtype = draw(st.sampled_from(list(mask_dtypes)))
        mask = torch.randn(sizes, generator=generator)
        mask = mask > -0.5 if mask_dtype == torch.bool else (mask.clamp(-3, 3) * 2).to(mask_dtype)
        if draw(st.booleans()):
            mask = draw(layouts(mask))
    out_shape = [batch, heads, queries, dim_v + int(rarely())]
    out = torch.full(out_shape, 7, dtype=draw(st.sampled_from([torch.float32, torch.float64])) if rarely() else q.dtype)
    if rarely():
        out = q  # over an input
    scale = draw(st.sampled_from([1e300, float("nan")])) if rarely() else draw(st.sampled_from([0.5, -2.0, 0.125]))
    return {"q": q, "k": k, "v": v, "mask": mask, "causal": draw(st.booleans()), "scale": scale, "out": out}


@given(call=_calls())
def test_attention_is_the_definition_or_a_clear_error(call: dict[str, Any]) -> None:
    q, k, v, mask, causal, scale, out = (call[n] for n in ("q", "k", "v", "mask", "causal", "scale", "out"))
    out_before = out.clone()

    def attend() -> None:
        _C.scaled_dot_product_attention(
            dlpack(q), dlpack(k), dlpack(v), None if mask is None else dlpack(mask), causal, scale, dlpack(out)
        )

    names = ["scaled_dot_product_attention", "q", "k", "v", "mask", "out", "scale"]
    ok, _ = call_or_refuse(attend, [out], names)
    if not ok:
        return
    assert q.dtype in (torch.float32, torch.bfloat16) and (out is not q or out.numel() == 0)  # empty: nothing shared
    assert k.dtype == v.dtype == out.dtype == q.dtype and math.isfinite(scale) and abs(scale) < 3.5e38
    if out.numel() == 0:
        assert torch.equal(out, out_before)
        return
    assert k.shape[-1] == q.shape[-1] and q.shape[1] % k.shape[1] == 0
    ordinary = all(t is None or t.dtype == torch.bool or bool((t.double().abs() <= 3).all()) for t in (q, k, v, mask))
    if not ordinary:
        return  # infinities, NaN, huge values: taken without a crash; what they give, float32 decides
    expected = _reference(q, k, v, mask, causal, scale)
    tolerance = (1 / 128, 1e-2) if q.dtype == torch.bfloat16 else (1e-4, 1e-4)
    torch.testing.assert_close(out.double(), expected, rtol=tolerance[0], atol=tolerance[1])
