"""What the property suite shares: hypothesis strategies for the inputs a user can pass (every dtype, odd shapes and
strides, meta tensors, special values, out-of-range indices) and the oracle every entry point is held to.

The oracle (:func:`call_or_refuse`): a call either returns what the reference computes, or raises TypeError,
ValueError, IndexError or RuntimeError, with a message that names the operator or an argument, **before anything
is written**: every tensor the call could write (outputs, parameters, optimizer state) is compared byte for byte
before and after a refused call.

The number of examples per property is bounded for CI (``EMBER_FUZZ_EXAMPLES``, default 25); a long fuzz run sets it
high (docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("EMBER_FUZZ_EXAMPLES", "25"))
settings.register_profile(
    "ember",
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 100,  # CI's bounded profile is reproducible; a long run explores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.load_profile("ember")

ALLOWED = (TypeError, ValueError, IndexError, RuntimeError, NotImplementedError)

FLOATS = (torch.float32, torch.bfloat16, torch.float64, torch.float16)
ALL_DTYPES = (*FLOATS, torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.complex64)
INDEX_DTYPES = (torch.int64, torch.int32)


def special_floats() -> st.SearchStrategy[float]:
    """Ordinary numbers, mostly, with NaN, infinities, signed zeros, denormals and huge values among them."""
    return st.one_of(
        st.floats(-4.0, 4.0, allow_nan=False, width=32),
        st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, -1e-42, 3e38, -3e38, 1e30]),
    )


@st.composite
def layouts(draw: Any, base: torch.Tensor) -> torch.Tensor:
    """A tensor of ``base``'s shape and dtype in a drawn memory layout: contiguous, transposed, sliced with a step,
    expanded from its first row (zero strides: the values change to that row's, a legal input all the same), or
    channels-last for 4-D. The references are computed from the tensor passed, whatever its values."""
    kind = draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded", "channels_last"]))
    if kind == "transposed" and base.dim() >= 2:
        return base.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "sliced" and base.dim() >= 1:
        return torch.repeat_interleave(base, 2, dim=-1)[..., ::2]
    if kind == "expanded" and base.dim() >= 1 and base.shape[0] >= 1:
        return base[:1].expand_as(base)
    if kind == "channels_last" and base.dim() == 4:
        return base.contiguous(memory_format=torch.channels_last)
    return base


@st.composite
def tensors(
    draw: Any,
    shape: Sequence[int] | st.SearchStrategy[Sequence[int]],
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    values: st.SearchStrategy[float] | None = None,
    odd_layouts: bool = True,
) -> torch.Tensor:
    """A CPU tensor of ``shape`` (or a drawn one) with a drawn dtype and values (special ones included by default),
    in a drawn layout."""
    if not isinstance(shape, (list, tuple)):
        shape = draw(shape)
    dtype = draw(st.sampled_from(list(dtypes)))
    count = 1
    for s in shape:
        count *= s
    floats = draw(
        st.lists(values if values is not None else special_floats(), min_size=min(count, 64), max_size=min(count, 64))
    )
    base = torch.tensor(floats or [0.0], dtype=torch.float64)
    flat = base.repeat((count + base.numel() - 1) // base.numel())[:count] if count else base[:0]
    t = _as_dtype(flat, dtype).reshape(tuple(shape))
    return draw(layouts(t)) if odd_layouts else t


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point or dtype.is_complex:
        return x.to(dtype)
    finite = torch.nan_to_num(x, nan=0.0, posinf=7.0, neginf=-7.0).clamp(-100, 100)
    if dtype == torch.bool:
        return finite != 0
    if dtype == torch.uint8:
        finite = finite.abs()
    return finite.to(dtype)


def shapes(min_dims: int = 0, max_dims: int = 4, max_side: int = 6) -> st.SearchStrategy[list[int]]:
    """Shapes with empty, size-1 and small sides."""
    return st.lists(st.integers(0, max_side), min_size=min_dims, max_size=max_dims)


def snapshot(tensors: Sequence[Any]) -> list[bytes | None]:
    """The bytes of every CPU tensor given (None for anything else), to compare after a refused call."""
    shots: list[bytes | None] = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            dense = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach()).reshape(-1)  # row-major, unit strides
            shots.append(dense.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            shots.append(None)
    return shots


def call_or_refuse(
    call: Callable[[], Any],
    written: Sequence[Any],
    names: Sequence[str],
) -> tuple[bool, Any]:
    """Runs ``call``. Returns (True, result) when it returns. When it raises, the exception must be one of
    :data:`ALLOWED`, its message must name one of ``names`` (the operator or an argument), and every tensor of
    ``written`` must hold the bytes it held before; then returns (False, exception). Anything else fails the test.
    """
    before = snapshot(written)
    try:
        return True, call()
    except ALLOWED as error:
        message = str(error)
        assert any(name in message for name in names), f"{type(error).__name__} names nothing: {message!r}"
        assert snapshot(written) == before, f"a refused call wrote its arguments: {message!r}"
        return False, error


def assert_close_or_both_nan(got: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float) -> None:
    """Values equal within tolerance, NaN where the reference has NaN, same shape and dtype."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
