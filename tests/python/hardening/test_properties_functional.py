"""Properties of every function in ember.nn.functional and ember.bf16: on any input a user can build, the result is
torch's (or a float64 reference's) within the dtype's tolerance, or a clear exception before anything is written
(fuzz.call_or_refuse)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fuzz import (
    ALL_DTYPES,
    FLOATS,
    INDEX_DTYPES,
    assert_close_or_both_nan,
    call_or_refuse,
    shapes,
    special_floats,
    tensors,
)
from hypothesis import given
from hypothesis import strategies as st

import ember
from ember.nn import functional as EF

# --- ember.bf16 ------------------------------------------------------------------------------------------------------


@given(x=tensors(shapes(), ALL_DTYPES), with_out=st.booleans(), out_dtype=st.sampled_from(ALL_DTYPES))
def test_bf16_round_is_torchs_rounding_or_a_clear_error(x, with_out, out_dtype):
    out = torch.full(x.shape, 7, dtype=out_dtype) if with_out else None
    ok, got = call_or_refuse(lambda: ember.bf16.round(x, out=out), [x, out], ["round", "x", "out"])
    if ok:
        assert x.dtype == torch.float32, f"round took {x.dtype}"
        assert_close_or_both_nan(got, x.to(torch.bfloat16), atol=0, rtol=0)
        if out is not None:
            assert got is out
    else:
        assert x.dtype != torch.float32 or (out is not None and out_dtype != torch.bfloat16)


@given(x=tensors(shapes(), (torch.float32, torch.float64, torch.bfloat16)))
def test_bf16_split_then_join_gives_back_every_bit(x):
    ok, halves = call_or_refuse(lambda: ember.bf16.split(x), [x], ["split", "x"])
    if not ok:
        assert x.dtype != torch.float32
        return
    top, bottom = halves
    assert top.dtype == torch.bfloat16 and top.shape == x.shape and bottom.shape == x.shape
    joined = ember.bf16.join(top, bottom)
    assert torch.equal(joined.view(torch.int32), x.contiguous().view(torch.int32))


@given(
    top=tensors(shapes(1, 3), (torch.bfloat16, torch.float32, torch.int16)),
    bottom_shape_delta=st.integers(0, 1),
    bottom_dtype=st.sampled_from([torch.int16, torch.bfloat16, torch.float32, torch.uint8]),
)
def test_bf16_join_refuses_mismatched_halves(top, bottom_shape_delta, bottom_dtype):
    shape = list(top.shape)
    shape[0] += bottom_shape_delta
    bottom = torch.zeros(shape, dtype=bottom_dtype)
    ok, got = call_or_refuse(lambda: ember.bf16.join(top, bottom), [top, bottom], ["join", "top", "bottom"])
    if ok:
        assert got.dtype == torch.float32 and got.shape == top.shape


# --- dropout ---------------------------------------------------------------------------------------------------------


@given(
    x=tensors(shapes(), ALL_DTYPES),
    p=st.one_of(st.floats(0, 1), st.sampled_from([-0.1, 1.5, float("nan"), float("inf")])),
    training=st.booleans(),
)
def test_dropout_keeps_or_scales_each_element_or_refuses(x, p, training):
    snapshot = x.clone()
    ok, got = call_or_refuse(lambda: EF.dropout(x, p, training), [x], ["dropout", "p", "input"])
    if not ok:
        return
    assert torch.equal(x, snapshot) or torch.equal(x.isnan(), snapshot.isnan()), "dropout wrote its input"
    assert got.shape == x.shape and got.dtype == x.dtype
    if not training or p == 0:
        assert_close_or_both_nan(got, x, atol=0, rtol=0)
    elif p == 1:  # everything dropped: zeros (torch >= 2), or x * 0 (torch 1.13: NaN for NaN and infinities)
        assert not got.bool().any() or torch.equal(got.isnan(), (x * 0).isnan())
    elif x.is_floating_point():
        # each element dropped (x * 0, as torch's mask multiplies: 0, or NaN for an infinity) or kept and scaled
        tol = 1e-2 if x.dtype in (torch.bfloat16, torch.float16) else 1e-5
        dropped = torch.isclose(got, x * 0, equal_nan=True)
        scaled = torch.isclose(got, (x.double() / (1 - p)).to(x.dtype), atol=tol, rtol=tol, equal_nan=True)
        assert bool((dropped | scaled).all()), (x, got)


# --- frozen_batch_norm -----------------------------------------------------------------------------------------------


def _frozen_reference(x, weight, bias, mean, var, eps):
    """torchvision's formula in float64, returned in torch's promotion of x and weight."""
    shape = [1, -1] + [1] * (x.dim() - 2)
    dtype = torch.result_type(x, weight)
    weight, bias, mean, var = (b.double() for b in (weight, bias, mean, var))
    scale = weight * (var + eps).rsqrt()
    return (x.double() * scale.reshape(shape) + (bias - mean * scale).reshape(shape)).to(dtype)


@given(
    x=tensors(st.lists(st.integers(0, 4), min_size=2, max_size=4).map(lambda s: [s[0], 3, *s[2:]]), FLOATS),
    buffer_dtype=st.sampled_from([*FLOATS, torch.int64]),
    channels=st.sampled_from([3, 3, 3, 2]),
    eps=st.sampled_from([1e-5, 0.0, 1.0]),
)
def test_frozen_batch_norm_matches_torchvisions_formula(x, buffer_dtype, channels, eps):
    g = torch.Generator().manual_seed(0)
    weight, bias, mean = (torch.randn(channels, generator=g).to(buffer_dtype) for _ in range(3))
    var = torch.rand(channels, generator=g).add(0.5).to(buffer_dtype)
    ok, got = call_or_refuse(
        lambda: EF.frozen_batch_norm(x, weight, bias, mean, var, eps),
        [x, weight, bias, mean, var],
        ["frozen_batch_norm", "x", "weight", "bias", "running_mean", "running_var", "size", "shape", "dimension"],
    )
    if not ok:
        return
    expected = _frozen_reference(x, weight, bias, mean, var, eps)
    low = torch.bfloat16 in (x.dtype, buffer_dtype) or torch.float16 in (x.dtype, buffer_dtype)
    tol = 5e-2 if low else 1e-5
    assert_close_or_both_nan(got, expected, atol=tol, rtol=tol)


# --- interaction -----------------------------------------------------------------------------------------------------


@given(
    batch=st.integers(0, 5),
    width=st.integers(0, 20),
    tables=st.integers(0, 4),
    dtype=st.sampled_from(ALL_DTYPES),
    mismatch=st.sampled_from(["none", "none", "batch", "width", "dtype", "ndim"]),
    data=st.data(),
)
def test_interaction_matches_its_definition(batch, width, tables, dtype, mismatch, data):
    dense = data.draw(tensors([batch, width], [dtype]))
    sparse = [data.draw(tensors([batch, width], [dtype])) for _ in range(tables)]
    if tables and mismatch == "batch":
        sparse[-1] = torch.zeros(batch + 1, width, dtype=dtype)
    elif tables and mismatch == "width":
        sparse[-1] = torch.zeros(batch, width + 1, dtype=dtype)
    elif tables and mismatch == "dtype":
        sparse[-1] = torch.ones(batch, width, dtype=torch.float64 if dtype != torch.float64 else torch.float32)
    elif mismatch == "ndim":
        dense = dense.reshape(-1)
    ok, got = call_or_refuse(
        lambda: EF.interaction(dense, *sparse), [dense, *sparse], ["interaction", "dense", "sparse"]
    )
    if not ok:
        return
    applied = mismatch if tables or mismatch == "ndim" else "none"
    assert dtype in (torch.float32, torch.bfloat16, torch.float64) and applied == "none", (dtype, applied)
    stacked = torch.stack([dense, *sparse], 1).double()
    dots = stacked @ stacked.transpose(1, 2)
    rows, cols = torch.tril_indices(tables + 1, tables + 1, offset=-1)
    expected = torch.cat([dense.double(), dots[:, rows, cols]], 1).to(dtype)
    # Where a sum of products passes float32's range the kernel (as torch's fp32 bmm) may overflow, into inf - inf
    # even: those dots are not compared with the float64 reference.
    magnitude = stacked.abs() @ stacked.abs().transpose(1, 2)
    beyond = torch.cat([torch.zeros_like(dense, dtype=torch.bool), magnitude[:, rows, cols] > 3e38], 1)
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
    assert_close_or_both_nan(got.masked_fill(beyond, 0), expected.masked_fill(beyond, 0), atol=tol, rtol=tol)


# --- merged_embedding_bag --------------------------------------------------------------------------------------------


@given(
    rows=st.integers(0, 6),
    dim=st.integers(0, 9),
    weight_dtype=st.sampled_from(ALL_DTYPES),
    index_dtype=st.sampled_from([*INDEX_DTYPES, torch.float32, torch.int16]),
    bags=st.lists(st.lists(st.integers(-8, 8), max_size=4), max_size=4),
    mode=st.sampled_from(["sum", "mean", "max"]),
    form=st.sampled_from(["offsets", "lengths", "include_last_offset"]),
    weighted=st.booleans(),
)
def test_merged_embedding_bag_matches_torchs_embedding_bag(
    rows, dim, weight_dtype, index_dtype, bags, mode, form, weighted
):
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(rows, dim, generator=g) * 3).to(weight_dtype)
    flat = [i for bag in bags for i in bag]
    indices = torch.tensor(flat, dtype=torch.int64).to(index_dtype)
    starts = torch.tensor([0, *torch.tensor([len(b) for b in bags]).cumsum(0).tolist()][:-1] if bags else [],
                          dtype=torch.int64).to(index_dtype)  # fmt: skip
    psw = torch.rand(len(flat), generator=g).to(weight_dtype) if weighted else None
    kwargs = {"mode": mode}
    if form == "lengths":
        kwargs["lengths"] = [torch.tensor([len(b) for b in bags], dtype=torch.int64)]
        offsets = None
    elif form == "include_last_offset":
        offsets = [torch.cat([starts, torch.tensor([len(flat)], dtype=starts.dtype)])]
        kwargs["include_last_offset"] = True
    else:
        offsets = [starts]
    ok, got = call_or_refuse(
        lambda: EF.merged_embedding_bag([weight], [indices], offsets, [psw] if weighted else None, **kwargs),
        [weight, indices, psw],
        ["merged_embedding_bag", "weights", "indices", "offsets", "lengths", "per_sample_weights", "mode"],
    )
    in_range = all(0 <= i < rows for i in flat)
    if not ok:
        return
    assert in_range, "out-of-range indices pooled"
    assert (
        index_dtype in INDEX_DTYPES
        and mode in ("sum", "mean")
        and weight_dtype
        in (
            torch.float32,
            torch.bfloat16,
            torch.float64,
        )
    )
    expected = F.embedding_bag(indices.long(), weight.double(), starts.long(), mode=mode,
                               per_sample_weights=psw.double() if weighted else None)  # fmt: skip
    tol = 5e-2 if weight_dtype == torch.bfloat16 else 1e-5
    assert_close_or_both_nan(got[0], expected.to(weight_dtype), atol=tol, rtol=tol)


# --- nms and roi_align -----------------------------------------------------------------------------------------------


def _nms_reference(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    b = boxes.double()
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    kept, suppressed = [], set()
    for i in order:
        if i in suppressed:
            continue
        kept.append(i)
        for j in order:
            if j in suppressed or j == i or j in kept:
                continue
            w = max(0.0, float(min(b[i, 2], b[j, 2]) - max(b[i, 0], b[j, 0])))
            h = max(0.0, float(min(b[i, 3], b[j, 3]) - max(b[i, 1], b[j, 1])))
            inter = w * h
            iou = inter / float(area[i] + area[j] - inter) if float(area[i] + area[j] - inter) != 0 else float("nan")
            if iou > threshold:
                suppressed.add(j)
    return kept


@given(
    n=st.integers(0, 12),
    dtype=st.sampled_from(ALL_DTYPES),
    threshold=st.one_of(st.floats(0, 1), st.just(float("nan"))),
    bad_shape=st.booleans(),
    data=st.data(),
)
def test_nms_keeps_the_reference_boxes(n, dtype, threshold, bad_shape, data):
    corners = data.draw(tensors([n, 2], [torch.float64], values=st.floats(0, 20), odd_layouts=False))
    sizes = data.draw(tensors([n, 2], [torch.float64], values=st.floats(0.5, 10), odd_layouts=False))
    boxes = torch.cat([corners, corners + sizes], 1).to(dtype)
    scores = data.draw(tensors([n], [torch.float64], values=st.floats(0, 1), odd_layouts=False)).to(dtype)
    if bad_shape:
        boxes = boxes[:, :3]
    ok, got = call_or_refuse(lambda: EF.nms(boxes, scores, threshold), [boxes, scores], ["nms", "boxes", "scores"])
    if not ok:
        return
    assert not bad_shape and dtype.is_floating_point  # half and bfloat16 boxes are widened to float32
    assert got.dtype == torch.int64
    if dtype == torch.float64:
        assert got.tolist() == _nms_reference(boxes, scores, threshold)


@given(
    n=st.integers(0, 2),
    channels=st.integers(0, 5),
    height=st.integers(0, 6),
    width=st.integers(0, 6),
    dtype=st.sampled_from(ALL_DTYPES),
    output=st.tuples(st.integers(-1, 3), st.integers(0, 3)),
    ratio=st.sampled_from([-1, 0, 1, 2, 2**31, 2**62]),
    scale=st.sampled_from([1.0, 0.5, 1e30, float("nan")]),
    batch_index=st.sampled_from([0, 1, -1, 5, 0.5]),
    coordinate=special_floats(),
    data=st.data(),
)
def test_roi_align_pools_finite_values_or_refuses(
    n, channels, height, width, dtype, output, ratio, scale, batch_index, coordinate, data
):
    x = data.draw(tensors([n, channels, height, width], [dtype], values=st.floats(-3, 3)))
    boxes = torch.tensor([[float(batch_index), 0.5, coordinate, 3.0, 4.0]], dtype=torch.float64)
    boxes = boxes.to(dtype if dtype.is_floating_point else torch.float32)
    ok, got = call_or_refuse(
        lambda: EF.roi_align(x, boxes, output, spatial_scale=scale, sampling_ratio=ratio),
        [x, boxes],
        ["roi_align", "input", "rois", "boxes", "output_size", "sampling", "spatial_scale"],
    )
    if not ok:
        return
    assert got.shape == (1, channels, *output) and got.dtype == x.dtype
    assert bool(torch.isfinite(got.double()).all()), "roi_align returned non-finite values from finite inputs"


@given(
    x=tensors(shapes(3, 4, max_side=7), ALL_DTYPES),
    kernel=st.integers(0, 4),
    stride=st.one_of(st.none(), st.integers(0, 3)),
    padding=st.integers(-1, 2),
    dilation=st.integers(0, 2),
    ceil_mode=st.booleans(),
    relu=st.booleans(),
)
def test_max_pool2d_is_torchs_or_refuses_as_torch_does(x, kernel, stride, padding, dilation, ceil_mode, relu):
    """Any tensor, layout and window: torch's values exactly (NaN where torch's, a max is exact), or an exception
    naming the operator or an argument where torch refuses too; with a ReLU taken in, torch's ReLU of the pool."""
    try:
        expected = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
    except RuntimeError:
        expected = None
    names = ["max_pool2d", "kernel", "stride", "pad", "dilation", "size", "input", "Expected", "not implemented"]
    ok, got = call_or_refuse(lambda: EF.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode), [x], names)
    assert ok == (expected is not None), (
        f"ember {'returned' if ok else got!r} where torch {'refused' if ok else 'did not'}"
    )
    if not ok:
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.nan_to_num(), expected.nan_to_num())
    if relu and x.dim() == 4 and x.dtype in (torch.float32, torch.bfloat16) and x.shape[1] > 0:
        from ember.nn.pooling import max_pool2d_on_kernel

        cl = x.contiguous(memory_format=torch.channels_last)
        pairs = [kernel] * 2, [kernel if stride is None else stride] * 2, [padding] * 2, [dilation] * 2
        fused = max_pool2d_on_kernel(cl, *pairs, ceil_mode, relu=True)
        assert fused is not None and torch.equal(fused.isnan(), expected.isnan())
        assert torch.equal(fused.nan_to_num(), torch.relu(expected).nan_to_num())


@given(
    x=tensors(shapes(3, 4, max_side=7), ALL_DTYPES),
    kernel=st.integers(0, 4),
    stride=st.one_of(st.none(), st.integers(0, 3)),
    padding=st.integers(-1, 2),
    ceil_mode=st.booleans(),
    count_include_pad=st.booleans(),
    divisor=st.sampled_from([None, 1, 3]),
    output_size=st.one_of(st.integers(0, 4), st.tuples(st.sampled_from([None, 1, 2, 3]), st.integers(1, 3))),
)
def test_average_pools_are_torchs_or_refuse_as_torch_does(
    x, kernel, stride, padding, ceil_mode, count_include_pad, divisor, output_size
):
    """avg_pool2d: torch's values to the bit, or an exception where torch refuses too. adaptive_avg_pool2d: torch's
    values within float32's rounding (torch takes a global pool as a mean, another summation order)."""
    names = ["avg_pool2d", "kernel", "stride", "pad", "size", "input", "Expected", "implemented", "divisor", "dtype"]
    try:
        expected = F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    except RuntimeError:
        expected = None
    ok, got = call_or_refuse(
        lambda: EF.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor), [x], names
    )
    assert ok == (expected is not None), f"ember {'returned' if ok else repr(got)} where torch differs"
    if ok:
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.nan_to_num(), expected.nan_to_num())
    try:
        expected = F.adaptive_avg_pool2d(x, output_size)
    except RuntimeError:
        expected = None
    names = ["adaptive_avg_pool2d", "output_size", "size", "input", "Expected", "not implemented", "dtype"]
    ok, got = call_or_refuse(lambda: EF.adaptive_avg_pool2d(x, output_size), [x], names)
    assert ok == (expected is not None), f"ember {'returned' if ok else repr(got)} where torch differs"
    if ok and expected.is_floating_point():
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert_close_or_both_nan(got, expected, atol=1e-6, rtol=1e-5 if x.dtype != torch.bfloat16 else 1e-2)


@pytest.mark.parametrize(
    "op",
    [
        "adaptive_avg_pool2d",
        "avg_pool2d",
        "frozen_batch_norm",
        "interaction",
        "max_pool2d",
        "nms",
        "roi_align",
        "merged_embedding_bag",
    ],
)
def test_every_functional_entry_point_is_fuzzed(op):
    # A new function in ember.nn.functional must get a property here: this list is the module's __all__ minus
    # dropout (fuzzed above by its own name).
    assert op in EF.__all__
    assert set(EF.__all__) == {
        "adaptive_avg_pool2d",
        "avg_pool2d",
        "dropout",
        "frozen_batch_norm",
        "interaction",
        "max_pool2d",
        "merged_embedding_bag",
        "nms",
        "roi_align",
    }
