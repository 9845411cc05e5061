"""Properties of ember's rotary-embedding kernel as Python reaches it (``ember._C.rotary_embedding``, which graph mode's
fused rotation calls): on any operands a caller can build (every dtype, odd widths, tables that do not broadcast,
odd layouts, an output that is wrong or overlaps an input), the result is a float64 reference's within the dtype's
tolerance, or a clear exception before anything is written."""

from __future__ import annotations

from typing import Any

import torch
from fuzz import ALL_DTYPES, call_or_refuse, layouts, special_floats, tensors
from hypothesis import given
from hypothesis import strategies as st

from ember import _C
from ember._tensor import dlpack

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = x.double(), cos.double(), sin.double()
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@st.composite
def _calls(draw: Any) -> dict[str, Any]:
    def rarely() -> bool:  # one call in ten: a wrong argument (or an empty size) of this kind
        return draw(st.integers(0, 9)) == 0

    def size(most: int) -> int:
        return 0 if rarely() else draw(st.integers(1, most))

    shape = [size(2), size(3), size(9), 2 * draw(st.integers(1, 40)) + int(rarely())]
    special = rarely()
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def operand(sizes: list[int], dtypes: Any) -> torch.Tensor:
        odd = rarely()
        if special:
            return draw(tensors(sizes, dtypes, special_floats(), odd_layouts=odd))
        t = (torch.randn(sizes, generator=generator) * 2).to(draw(st.sampled_from(list(dtypes))))
        if odd:
            return draw(layouts(t))
        return t.transpose(1, 2).contiguous().transpose(1, 2) if len(sizes) == 4 and draw(st.booleans()) else t

    x = operand(shape, ALL_DTYPES if rarely() else _KERNEL_DTYPES)
    leading = [s if draw(st.booleans()) else 1 for s in shape[:3]][draw(st.integers(0, 3)) :]
    table_shape = [*leading, shape[3]]
    if rarely():
        table_shape[-1] += 1  # does not broadcast
    table_dtypes = ALL_DTYPES if rarely() else _KERNEL_DTYPES
    cos = operand(table_shape, table_dtypes)
    sin = operand(table_shape, [cos.dtype] if not rarely() else ALL_DTYPES)
    out_dtype = draw(st.sampled_from(ALL_DTYPES if rarely() else _KERNEL_DTYPES))
    out = torch.full([*shape[:3], shape[3] + int(rarely())], 7, dtype=out_dtype)
    if rarely():
        out = x  # over an input
    return {"x": x, "cos": cos, "sin": sin, "out": out}


@given(call=_calls())
def test_rotary_embedding_is_the_definition_or_a_clear_error(call: dict[str, Any]) -> None:
    x, cos, sin, out = (call[n] for n in ("x", "cos", "sin", "out"))
    before = out.clone()
    names = ["rotary_embedding", "x", "cos", "sin", "out"]
    ok, _ = call_or_refuse(lambda: _C.rotary_embedding(dlpack(x), dlpack(cos), dlpack(sin), dlpack(out)), [out], names)
    if not ok:
        return
    assert x.dtype in _KERNEL_DTYPES and cos.dtype == sin.dtype and cos.dtype in _KERNEL_DTYPES
    assert out.dtype in _KERNEL_DTYPES and out.shape == x.shape and x.shape[-1] % 2 == 0
    if out.numel() == 0 or out is x:
        assert out.numel() == 0 and torch.equal(out, before)
        return
    ordinary = all(bool((t.double().abs() <= 1e4).all()) for t in (x, cos, sin))
    if not ordinary:
        return  # infinities, NaN, huge values: taken without a crash; what they give, float32 decides
    tolerance = 1 / 64 if torch.bfloat16 in (x.dtype, cos.dtype, out.dtype) else 1e-5
    torch.testing.assert_close(out.double(), _reference(x, cos, sin), rtol=tolerance, atol=tolerance)
