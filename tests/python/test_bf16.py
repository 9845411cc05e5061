"""ember.bf16 against bit-level definitions and torch, on every ISA path."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import bf16

# ----------------------------------------------------------------------------------------------------------------
# Bit-level references, in numpy (independent of both torch's conversion and ember's).


def bits_of(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.int32).numpy().view(np.uint32)


def ref_round(bits: np.ndarray) -> np.ndarray:
    bits = bits.astype(np.uint64)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    quiet = (bits >> 16) | 0x0040
    return np.where(is_nan, quiet, rounded).astype(np.uint16)


def as_u16(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def random_patterns(n: int, gen: torch.Generator) -> torch.Tensor:
    """Uniformly random fp32 bit patterns: NaNs, infinities, denormals and all."""
    return torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=gen).to(torch.int32).view(torch.float32)


SPECIAL_BITS = [
    0x00000000, 0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x0000FFFF, 0x00010000, 0x007FFFFF, 0x00800000,
    0x3F800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000,
    0x7F800001, 0x7F807FFF, 0x7F808000, 0x7F80FFFF, 0x7FC00000, 0x7FFF8000, 0x7FFFFFFF, 0x7FA00001,
]  # fmt: skip


def special_values() -> torch.Tensor:
    bits = np.array(SPECIAL_BITS + [b | 0x80000000 for b in SPECIAL_BITS], dtype=np.uint32)
    return torch.from_numpy(bits.view(np.int32).copy()).view(torch.float32)


def all_tops() -> torch.Tensor:
    """Every 16-bit top half, each with bottoms around the rounding tie."""
    tops = np.arange(1 << 16, dtype=np.uint32)[:, None] << 16
    bottoms = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)[None, :]
    return torch.from_numpy((tops | bottoms).reshape(-1).view(np.int32).copy()).view(torch.float32)


# ----------------------------------------------------------------------------------------------------------------
# Correctness on every ISA path


@pytest.fixture(params=["cached", "streamed"])
def store_mode(request: pytest.FixtureRequest):
    """Plain stores, then non-temporal stores (forced by a zero threshold), which take another code path."""
    saved = ember._C.stream_threshold_bytes()
    ember._C.set_stream_threshold_bytes(0 if request.param == "streamed" else 2**62)
    yield request.param
    ember._C.set_stream_threshold_bytes(saved)


@pytest.mark.parametrize("source", ["special", "all_tops", "random"])
def test_split_join_round_bit_exact(isa_level: str, store_mode: str, source: str, gen: torch.Generator) -> None:
    x = {"special": special_values, "all_tops": all_tops, "random": lambda: random_patterns(100_003, gen)}[source]()
    top, bottom = bf16.split(x)
    assert top.dtype == torch.bfloat16 and bottom.dtype == torch.int16
    bits = bits_of(x)
    np.testing.assert_array_equal(as_u16(top), (bits >> 16).astype(np.uint16))
    np.testing.assert_array_equal(as_u16(bottom), (bits & 0xFFFF).astype(np.uint16))
    np.testing.assert_array_equal(bits_of(bf16.join(top, bottom)), bits)
    np.testing.assert_array_equal(as_u16(bf16.round(x)), ref_round(bits))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 1000, (1 << 16) + 3])
@pytest.mark.parametrize("offset", [0, 1, 5])
def test_lengths_and_alignments(isa_level: str, store_mode: str, n: int, offset: int, gen: torch.Generator) -> None:
    # Storage offsets misalign inputs and outputs alike, so aligned-store paths must peel a head; guard elements
    # on both sides catch vector stores that stray outside the output.
    guard = 64
    buffers: list[torch.Tensor] = []

    def shifted(dtype: torch.dtype) -> torch.Tensor:
        words = 2 if dtype == torch.float32 else 1
        buf = torch.full(((n + offset + guard) * words,), POISON, dtype=torch.int16)
        buffers.append(buf)
        return buf.view(dtype)[offset : offset + n]

    x = (torch.randn(n + offset, generator=gen) * 100)[offset:]
    top, bottom = bf16.split(x, out=(shifted(torch.bfloat16), shifted(torch.int16)))
    joined = bf16.join(top, bottom, out=shifted(torch.float32))
    rounded = bf16.round(x, out=shifted(torch.bfloat16))
    assert torch.equal(joined.view(torch.int32), x.view(torch.int32))
    assert torch.equal(rounded.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(top.view(torch.int16), (x.view(torch.int32) >> 16).to(torch.int16))
    for buf in buffers:
        words = buf.numel() // (n + offset + guard)
        outside = torch.cat([buf[: offset * words], buf[(offset + n) * words :]])
        assert (outside == POISON).all(), "a store wrote outside its output"


def test_round_matches_torch_except_nan_encoding(isa_level: str, gen: torch.Generator) -> None:
    x = random_patterns(200_000, gen)
    ours, theirs = bf16.round(x), x.to(torch.bfloat16)
    nan = torch.isnan(x)
    assert torch.equal(ours.view(torch.int16)[~nan], theirs.view(torch.int16)[~nan])
    assert torch.isnan(ours[nan]).all(), "NaN must stay NaN"
    # torch returns one canonical NaN; ember keeps the sign of each NaN.
    assert torch.equal(torch.signbit(ours[nan].float()), torch.signbit(x[nan]))


def test_top_is_truncation_toward_zero(gen: torch.Generator) -> None:
    x = torch.randn(10_000, generator=gen)
    top, _ = bf16.split(x)
    assert (top.float().abs() <= x.abs()).all()
    ulp = torch.finfo(torch.bfloat16).eps * x.abs()
    assert ((x - top.float()).abs() < ulp).all()


def test_implementation_follows_the_cap() -> None:
    for level in ember.isa.supported_levels():
        with ember.isa.capped(level):
            for op in ("split", "join", "round"):
                impl = ember._C.bf16_implementation(op)
                assert ember.isa.LEVELS.index(impl) <= ember.isa.LEVELS.index(level)
    with pytest.raises(ValueError, match="op must be"):
        ember._C.bf16_implementation("scale")


# ----------------------------------------------------------------------------------------------------------------
# Shapes, layouts, out=


@given(shape=st.lists(st.integers(0, 7), min_size=0, max_size=4), transpose=st.booleans())
@settings(max_examples=60, deadline=None)
def test_any_shape_and_layout(shape: list[int], transpose: bool) -> None:
    x = torch.randn(*shape) if shape else torch.randn(())
    if transpose and x.dim() >= 2:
        x = x.transpose(0, 1)
    top, bottom = bf16.split(x)
    assert top.shape == x.shape and bottom.shape == x.shape
    assert torch.equal(bf16.join(top, bottom), x)
    assert bf16.round(x).shape == x.shape


def test_out_arguments_are_written_and_returned(gen: torch.Generator) -> None:
    x = torch.randn(3, 5, generator=gen)
    top, bottom = torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(3, 5, dtype=torch.int16)
    rtop, rbottom = bf16.split(x, out=(top, bottom))
    assert rtop is top and rbottom is bottom
    joined = torch.empty(3, 5)
    assert bf16.join(top, bottom, out=joined) is joined and torch.equal(joined, x)
    rounded = torch.empty(3, 5, dtype=torch.bfloat16)
    assert bf16.round(x, out=rounded) is rounded
    assert torch.equal(rounded, x.to(torch.bfloat16))


def test_parameters_that_require_grad_are_accepted(gen: torch.Generator) -> None:
    p = torch.nn.Parameter(torch.randn(100, generator=gen))
    top, bottom = bf16.split(p)
    assert not top.requires_grad
    assert torch.equal(bf16.join(top, bottom), p.detach())


def test_result_does_not_depend_on_thread_count(gen: torch.Generator) -> None:
    x = random_patterns((1 << 20) + 5, gen)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        reference = bf16.round(x)
        assert ember._C.num_threads() == 1
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(bf16.round(x).view(torch.int16), reference.view(torch.int16))
            assert ember._C.num_threads() == threads
    finally:
        torch.set_num_threads(saved)


def test_concurrent_calls_from_python_threads(gen: torch.Generator) -> None:
    inputs = [torch.randn(300_000, generator=gen) for _ in range(4)]
    results: dict[int, bool] = {}

    def work(i: int) -> None:
        for _ in range(5):
            top, bottom = bf16.split(inputs[i])
            results[i] = torch.equal(bf16.join(top, bottom), inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True, 3: True}


# ----------------------------------------------------------------------------------------------------------------
# Bad input: a clear exception, and nothing written


POISON = -8531  # 0xDEAD as int16


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, POISON, dtype=torch.int16).view(dtype)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: bf16.split([1.0, 2.0]), TypeError, r"bf16.split: x must be a torch.Tensor, got list"),
        (lambda: bf16.split(torch.ones(4, dtype=torch.float64)), TypeError, r"x must have dtype float32, got float64"),
        (lambda: bf16.round(torch.ones(4, dtype=torch.bfloat16)), TypeError, r"x must have dtype float32"),
        (
            lambda: bf16.join(torch.ones(4), torch.ones(4, dtype=torch.int16)),
            TypeError,
            r"top must have dtype bfloat16",
        ),
        (
            lambda: bf16.join(torch.ones(4, dtype=torch.bfloat16), torch.ones(5, dtype=torch.int16)),
            ValueError,
            r"bottom must have the shape of top \(bfloat16\[4\]\), got int16\[5\]",
        ),
        (lambda: bf16.split(torch.ones(4), out=torch.ones(4)), TypeError, r"out must be a \(top, bottom\) pair"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_bad_out_leaves_everything_untouched() -> None:
    x = torch.randn(8)
    x_before = x.clone()
    top = poisoned((8,), torch.bfloat16)
    bottom_wrong_shape = poisoned((4,), torch.int16)
    with pytest.raises(ValueError, match="bottom must have the shape of x"):
        bf16.split(x, out=(top, bottom_wrong_shape))
    assert (top.view(torch.int16) == POISON).all() and (bottom_wrong_shape == POISON).all()
    bottom_strided = poisoned((16,), torch.int16)[::2]
    with pytest.raises(ValueError, match="bottom must be contiguous"):
        bf16.split(x, out=(top, bottom_strided))
    assert (top.view(torch.int16) == POISON).all()
    assert torch.equal(x, x_before)


def test_outputs_may_not_alias_inputs() -> None:
    buf = torch.randn(16)
    with pytest.raises(ValueError, match="out must not share memory with x"):
        bf16.round(buf, out=buf.view(torch.bfloat16)[:16])
    top = torch.empty(16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bottom must not share memory with top"):
        bf16.split(buf, out=(top, top.view(torch.int16)))


def test_join_output_aliasing_top_is_rejected() -> None:
    storage = torch.zeros(32, dtype=torch.int16)
    top = storage[:16].view(torch.bfloat16)
    bottom = torch.zeros(16, dtype=torch.int16)
    with pytest.raises(ValueError, match="out must not share memory with top"):
        bf16.join(top, bottom, out=storage.view(torch.float32))
