"""ember.nn.Dropout / ember.nn.functional.dropout: the mask against an independent Philox in numpy, the arithmetic
against torch's own formula given that mask, autograd (in place, double backward, checkpointing), layouts,
statistics, seeding, and the fallbacks."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.nn import Dropout
from ember.nn.dropout import _Dropout
from ember.nn.functional import dropout

KERNEL_DTYPES = [torch.float32, torch.bfloat16]

# ----------------------------------------------------------------------------------------------------------------
# Philox4x32-10 and the tile mapping of csrc/include/ember/dropout.h, in numpy: an independent reference.

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def philox_words(blocks: np.ndarray, seed: int) -> np.ndarray:
    """The four words of each block (counter = (block, 0)), shape (len(blocks), 4), as uint64 holding uint32."""
    c0 = blocks.astype(np.uint64) & MASK32
    c1 = blocks.astype(np.uint64) >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0 = c0 * np.uint64(M0)
        p1 = c2 * np.uint64(M1)
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
            p1 & MASK32,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
            p0 & MASK32,
        )
    return np.stack([c0, c1, c2, c3], axis=1)


def reference_keep(n: int, p: float, seed: int) -> torch.Tensor:
    """Which of n elements (in memory order) are kept: word(i) >= round(p * 2^32)."""
    i = np.arange(n, dtype=np.uint64)
    tile, k = i // np.uint64(64), i % np.uint64(64)
    words = philox_words(np.arange((n + 63) // 64 * 16, dtype=np.uint64), seed)
    word = words[(np.uint64(16) * tile + k % np.uint64(16)).astype(np.int64), (k // np.uint64(16)).astype(np.int64)]
    threshold = min(round(p * 2**32), 2**32 - 1) if p < 1 else 0
    keep = word >= np.uint64(threshold)
    if p == 1:
        keep[:] = False
    return torch.from_numpy(keep)


def torch_formula(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """What torch 2.x's CPU dropout computes given its mask, input.mul(mask).mul_(1 / (1 - p)): the product in
    float32 with the scale rounded to float32, then rounded once to the input's dtype. (torch 1.13 rounds the
    scale to bf16 first for bf16 inputs.)"""
    scale = torch.tensor(0.0 if p == 1 else 1.0 / (1.0 - p), dtype=torch.float32)
    return x.float().mul(keep.float()).mul_(scale).to(x.dtype)


def assert_bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), (a - b).abs().max()
    assert torch.equal(torch.signbit(a), torch.signbit(b)), "zeros of different sign"


def memory_order_flat(t: torch.Tensor) -> torch.Tensor:
    """t's elements in the order they lie in memory (t dense)."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.permute(order).reshape(-1)


# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 12345, 2**63 + 977, 2**64 - 1])
def test_mask_is_philox_and_arithmetic_is_torchs(dtype, p, seed):
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(seed % 1000)).to(dtype)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), -0.0, -1.5])
    y = _Dropout.apply(x, p, seed, False)
    keep = reference_keep(x.numel(), p, seed).reshape(x.shape)
    expected = torch_formula(x, keep, p)
    assert_bitwise_equal(torch.nan_to_num(y, nan=7.0), torch.nan_to_num(expected, nan=7.0))
    assert torch.equal(torch.isnan(y), torch.isnan(expected))  # a dropped infinity is NaN, as in torch


@pytest.mark.parametrize("isa", ember.isa.supported_levels())
def test_every_isa_path_gives_the_same_mask(isa):
    x = torch.randn(4099)
    with ember.isa.capped(isa):
        y = _Dropout.apply(x, 0.3, 99, False)
    keep = reference_keep(x.numel(), 0.3, 99)
    assert_bitwise_equal(y, torch_formula(x, keep, 0.3))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_backward_uses_the_forward_mask(dtype):
    x = torch.randn(8, 33, 17).to(dtype).requires_grad_()
    y = dropout(x, 0.4)
    keep = y.detach() != 0
    g = torch.randn_like(y)
    y.backward(g)
    assert_bitwise_equal(x.grad, torch_formula(g, keep, 0.4))


def test_double_backward():
    x = torch.randn(500, requires_grad=True)
    w = torch.randn(500, requires_grad=True)
    y = dropout(x, 0.25)
    keep = y.detach() != 0
    (gx,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
    assert_bitwise_equal(gx.detach(), torch_formula(w.detach(), keep, 0.25))
    (gw,) = torch.autograd.grad(gx.sum(), w)
    assert_bitwise_equal(gw, torch_formula(torch.ones(500), keep, 0.25))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_in_place(dtype):
    base = torch.randn(64, 40).to(dtype).requires_grad_()
    x = base * 1  # a non-leaf that may be modified in place
    x_before = x.detach().clone()
    y = dropout(x, 0.5, inplace=True)
    assert y is x
    keep = y.detach() != 0
    assert_bitwise_equal(y.detach(), torch_formula(x_before, keep, 0.5))
    y.sum().backward()
    assert_bitwise_equal(base.grad, torch_formula(torch.ones_like(x_before), keep, 0.5))
    # A leaf that requires grad may not be modified in place, as with torch's dropout.
    leaf = torch.randn(10, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        dropout(leaf, 0.5, inplace=True)


def test_layouts_keep_strides_and_gradients_of_any_layout_get_the_right_mask():
    x = torch.randn(2, 8, 5, 7).to(memory_format=torch.channels_last).requires_grad_()
    y = dropout(x, 0.5)
    assert y.is_contiguous(memory_format=torch.channels_last)
    kept = y.detach() != 0
    g = torch.randn(2, 8, 5, 7)  # contiguous: another layout than the input's
    y.backward(g)
    assert_bitwise_equal(x.grad, torch_formula(g, kept, 0.5))
    # The mask lies over memory order (here channels-last), and a gradient with stride 0 (from sum) gets it too.
    x.grad = None
    dropout_y = _Dropout.apply(x, 0.5, 4242, False)
    dropout_y.sum().backward()
    keep = reference_keep(x.numel(), 0.5, 4242)
    assert torch.equal(memory_order_flat(x.grad) != 0, keep)


def test_non_dense_inputs_are_made_contiguous():
    base = torch.randn(10, 20)
    x = base[:, ::2]  # gaps
    y = _Dropout.apply(x, 0.5, 7, False)
    assert y.is_contiguous()
    assert_bitwise_equal(y, torch_formula(x.contiguous(), reference_keep(x.numel(), 0.5, 7).reshape(10, 10), 0.5))
    before = base.clone()
    z = _Dropout.apply(x, 0.5, 7, True)
    assert z.data_ptr() == x.data_ptr()  # torch 1.13 returns another tensor object for an in-place view
    assert_bitwise_equal(x, y)
    assert torch.equal(base[:, 1::2], before[:, 1::2])  # only the view's elements were written


def test_statistics_and_seeding():
    x = torch.ones(1 << 20)
    for p in (0.1, 0.5, 0.9):
        kept = (dropout(x, p) != 0).double().mean().item()
        sigma = (p * (1 - p) / x.numel()) ** 0.5
        assert abs(kept - (1 - p)) < 6 * sigma
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    b = dropout(x, 0.5)
    torch.manual_seed(3)
    c = dropout(x, 0.5)
    assert torch.equal(a, c)
    assert not torch.equal(a, b)


def test_result_does_not_depend_on_thread_count():
    x = torch.randn(1 << 18)
    saved = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(_Dropout.apply(x, 0.3, 5, False))
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_checkpointing_recomputes_the_same_mask():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(16, 16)

    def block(t):
        return dropout(torch.tanh(lin(t)), 0.5).sum(dim=1)

    x = torch.randn(32, 16, requires_grad=True)
    torch.manual_seed(11)
    block(x).sum().backward()
    plain = x.grad.clone()
    x.grad = None
    torch.manual_seed(11)
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, plain)


def test_edge_cases_and_errors():
    x = torch.randn(5, 6)
    assert dropout(x, 0.5, training=False) is x
    y = dropout(x, 0.0)
    assert y is not x and torch.equal(y, x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert dropout(torch.empty(0, 3), 0.5).shape == (0, 3)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="between 0 and 1"):
            dropout(x, bad)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        dropout([1.0, 2.0], 0.5)


def test_kernel_refusals_write_nothing():
    x = torch.randn(64)
    out = torch.full((64,), 3.0)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        ember._C.dropout(x.double(), out.double(), 0.5, 1)
    with pytest.raises(TypeError, match="out must have dtype float32"):
        ember._C.dropout(x, out.bfloat16(), 0.5, 1)
    with pytest.raises(ValueError, match="shape"):
        ember._C.dropout(x, out[:32], 0.5, 1)
    with pytest.raises(ValueError, match="p must be in"):
        ember._C.dropout(x, out, 2.0, 1)
    with pytest.raises(ValueError, match="share memory"):
        ember._C.dropout(out[:63], out[1:], 0.5, 1)
    assert torch.equal(out, torch.full((64,), 3.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_go_to_torch(dtype):
    x = torch.randn(100).to(dtype)
    torch.manual_seed(5)
    try:
        expected = F.dropout(x, 0.3)
    except RuntimeError as error:  # torch 1.13 has no float16 dropout on the CPU
        with pytest.raises(RuntimeError, match=str(error)):
            dropout(x, 0.3)
        return
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.3), expected)


def test_under_autocast_keeps_the_dtype():
    x = torch.randn(10, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert dropout(x, 0.5).dtype == torch.float32
        assert dropout(x.bfloat16(), 0.5).dtype == torch.bfloat16


def test_module_is_a_drop_in():
    theirs = torch.nn.Dropout(0.2, inplace=True)
    ours = Dropout(0.2, inplace=True)
    assert repr(ours) == repr(theirs)
    assert isinstance(ours, torch.nn.Dropout)
    assert ours.state_dict() == {}
    x = torch.randn(8, 8)
    assert ours.eval()(x) is x
    ours.train()
    y = ours(x.clone())
    assert ((y == 0) | torch.isclose(y, x / 0.8)).all()
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(clone) is Dropout and clone.p == 0.2 and clone.inplace
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False) if _has_weights_only() else torch.load(buffer)) is Dropout


def _has_weights_only() -> bool:
    import inspect

    return "weights_only" in inspect.signature(torch.load).parameters
