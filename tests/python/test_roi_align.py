"""ember.nn.functional.roi_align / ember.nn.RoIAlign against a transcription of torchvision's CPU kernel (its float32
sample geometry, float64 sums) on every ISA path, against torchvision where it imports (torch 1.13 here); layouts,
dtypes, boxes as a tensor or a list, backward and gradcheck, fx/compile, ember.optimize's swap, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import ember
from ember.nn import RoIAlign
from ember.nn.functional import roi_align

HAS_COMPILE = hasattr(torch, "compile") and hasattr(torch.library, "register_fake")
try:
    import torchvision.ops as tv_ops
except Exception:
    tv_ops = None


def reference(x: torch.Tensor, rois: torch.Tensor, ph: int, pw: int, scale: float, ratio: int, aligned: bool,
              real: type = np.float32) -> torch.Tensor:  # fmt: skip
    """torchvision/csrc/ops/cpu/roi_align_kernel.cpp: geometry in ``real`` (float32, or float64 for a float64
    input: torchvision computes in the input's type), the bins' sums in float64."""
    f32 = real
    x = x.double().numpy()
    n_c, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    out = np.zeros((rois.shape[0], n_c, ph, pw))
    for k, roi in enumerate(rois.numpy().astype(real)):
        b = int(roi[0])
        off = 0.5 if aligned else 0.0
        sw, sh, ew, eh = (f32(float(roi[i]) * scale - off) for i in (1, 2, 3, 4))
        rw, rh = f32(ew - sw), f32(eh - sh)
        if not aligned:
            rw, rh = max(rw, f32(1)), max(rh, f32(1))
        bh, bw = f32(rh / f32(ph)), f32(rw / f32(pw))
        gh = ratio if ratio > 0 else math.ceil(f32(rh / f32(ph)))
        gw = ratio if ratio > 0 else math.ceil(f32(rw / f32(pw)))
        count = max(gh * gw, 1)
        for i in range(ph):
            for j in range(pw):
                acc = np.zeros(n_c)
                for iy in range(gh):
                    yy = f32(f32(sh + f32(f32(i) * bh)) + f32(f32(f32(iy + 0.5) * bh) / f32(gh)))
                    for ix in range(gw):
                        xx = f32(f32(sw + f32(f32(j) * bw)) + f32(f32(f32(ix + 0.5) * bw) / f32(gw)))
                        y, xq = yy, xx
                        if y < -1.0 or y > h_ or xq < -1.0 or xq > w_:
                            continue
                        y, xq = max(y, f32(0)), max(xq, f32(0))
                        yl, xl = int(y), int(xq)
                        if yl >= h_ - 1:
                            yl = yh = h_ - 1
                            y = f32(yl)
                        else:
                            yh = yl + 1
                        if xl >= w_ - 1:
                            xl = xh = w_ - 1
                            xq = f32(xl)
                        else:
                            xh = xl + 1
                        ly, lx = f32(y - f32(yl)), f32(xq - f32(xl))
                        hy, hx = f32(1 - ly), f32(1 - lx)
                        img = x[b]
                        acc += (float(hy * hx) * img[:, yl, xl] + float(hy * lx) * img[:, yl, xh]
                                + float(ly * hx) * img[:, yh, xl] + float(ly * lx) * img[:, yh, xh])  # fmt: skip
                out[k, :, i, j] = acc / count
    return torch.from_numpy(out)


def random_rois(k: int, n: int, h: int, w: int, gen: torch.Generator, scale: float) -> torch.Tensor:
    xy = torch.rand(k, 2, generator=gen) * torch.tensor([w, h]) / scale - 2
    wh = torch.rand(k, 2, generator=gen) * torch.tensor([w, h]) / scale * 0.7
    index = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([index, xy, xy + wh], dim=1)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("ratio", [2, 0, -1])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_matches_torchvisions_kernel(isa_level, aligned, ratio, layout, gen):
    x = torch.randn(2, 19, 13, 11, generator=gen)
    rois = random_rois(5, 2, 13, 11, gen, 0.5)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    got = roi_align(x, rois, (3, 4), 0.5, ratio, aligned)
    assert got.shape == (5, 19, 3, 4)
    assert got.is_contiguous(
        memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format
    )
    torch.testing.assert_close(got.double(), reference(x, rois, 3, 4, 0.5, ratio, aligned), atol=1e-5, rtol=1e-5)
    if tv_ops is not None:
        torch.testing.assert_close(got, tv_ops.roi_align(x, rois, (3, 4), 0.5, ratio, aligned), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(tv_ops is None, reason="torchvision does not import here")
@pytest.mark.parametrize("aligned", [False, True])
def test_backward_matches_torchvision(aligned, gen):
    x = torch.randn(2, 8, 16, 16, generator=gen, requires_grad=True)
    rois = random_rois(7, 2, 16, 16, gen, 0.25)
    grad = torch.randn(7, 8, 5, 5, generator=gen)
    (ours,) = torch.autograd.grad(roi_align(x, rois, 5, 0.25, 2, aligned), x, grad)
    (theirs,) = torch.autograd.grad(tv_ops.roi_align(x, rois, 5, 0.25, 2, aligned), x, grad)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("ratio", "aligned"), [(2, True), (-1, False)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_gradcheck_float64(ratio, aligned, layout, gen):
    # float64 runs the kernel's double path: gradcheck at its float64 defaults, boxes partly outside the image.
    x = torch.randn(2, 5, 6, 7, generator=gen, dtype=torch.float64)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    rois = torch.tensor([[0, 0.5, 0.7, 4.2, 5.1], [1, 2.0, 1.0, 3.0, 5.5], [1, -1.5, 3.0, 8.0, 7.5]])
    assert torch.autograd.gradcheck(lambda t: roi_align(t, rois, (2, 3), 0.8, ratio, aligned), (x,))


@pytest.mark.parametrize("aligned", [False, True])
def test_float64_matches_torchvisions_kernel_in_double(aligned, gen):
    x = torch.randn(2, 9, 13, 11, generator=gen, dtype=torch.float64)
    rois = random_rois(5, 2, 13, 11, gen, 0.5).double()
    got = roi_align(x, rois, (3, 4), 0.5, -1, aligned)
    assert got.dtype == torch.float64
    expect = reference(x, rois, 3, 4, 0.5, -1, aligned, real=np.float64)
    torch.testing.assert_close(got, expect, atol=1e-12, rtol=1e-12)
    if tv_ops is not None:
        torch.testing.assert_close(got, tv_ops.roi_align(x, rois, (3, 4), 0.5, -1, aligned), atol=1e-12, rtol=1e-12)


def test_backward_is_the_same_for_any_thread_count_and_layout(gen):
    x = torch.randn(2, 40, 12, 12, generator=gen, requires_grad=True)
    rois = random_rois(30, 2, 12, 12, gen, 1.0)
    grad = torch.randn(30, 40, 3, 3, generator=gen)
    grads = []
    for threads in (1, 2):
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            grads.append(torch.autograd.grad(roi_align(x, rois, 3, 1.0, 2), x, grad)[0])
        finally:
            torch.set_num_threads(saved)
    assert torch.equal(grads[0], grads[1])
    x_cl = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    (g_cl,) = torch.autograd.grad(roi_align(x_cl, rois, 3, 1.0, 2), x_cl, grad)
    assert g_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(g_cl, grads[0], atol=1e-6, rtol=1e-6)


def test_bfloat16_sums_in_float32_and_rounds_once(gen):
    x = torch.randn(1, 24, 10, 10, generator=gen).to(torch.bfloat16)
    rois = random_rois(4, 1, 10, 10, gen, 1.0)
    got = roi_align(x, rois, 4, 1.0, 2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), reference(x.float(), rois, 4, 4, 1.0, 2, False), atol=1e-2, rtol=2**-8)


def test_boxes_as_a_list_and_the_module(gen):
    x = torch.randn(2, 4, 9, 9, generator=gen)
    per_image = [torch.tensor([[1.0, 1.0, 6.0, 7.0]]), torch.tensor([[0.0, 2.0, 8.0, 8.0], [3.0, 3.0, 4.0, 4.0]])]
    as_tensor = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0], [1, 0.0, 2.0, 8.0, 8.0], [1, 3.0, 3.0, 4.0, 4.0]])
    module = RoIAlign((2, 3), 1.0, 2)
    torch.testing.assert_close(module(x, per_image), roi_align(x, as_tensor, (2, 3), 1.0, 2))
    assert repr(module) == "RoIAlign(output_size=(2, 3), spatial_scale=1.0, sampling_ratio=2, aligned=False)"
    if tv_ops is not None:
        assert repr(module) == repr(tv_ops.RoIAlign((2, 3), 1.0, 2))
    assert roi_align(x, torch.empty(0, 5), 2).shape == (0, 4, 2, 2)


def test_one_operator_under_fx():
    class Head(nn.Module):
        def forward(self, x, rois):
            return roi_align(x, rois, 7, 0.25, 2, True)

    traced = torch.fx.symbolic_trace(Head())
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [torch.ops.ember.roi_align]


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with fake kernels needs torch >= 2.4")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
def test_torch_compile_without_a_break(gen):
    x = torch.randn(1, 8, 10, 10, generator=gen, requires_grad=True)
    rois = random_rois(3, 1, 10, 10, gen, 1.0)
    compiled = torch.compile(lambda t: roi_align(t, rois, 3, 1.0, 2).square().sum(), fullgraph=True)
    compiled(x).backward()
    expect = torch.autograd.grad(roi_align(x, rois, 3, 1.0, 2).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expect)


def test_bad_input_raises_a_clear_error():
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(IndexError, match=r"rois\[0\] has batch index 2"):
        roi_align(x, torch.tensor([[2.0, 0, 0, 4, 4]]), 2)
    with pytest.raises(ValueError, match=r"must be \[K, 5\]"):
        roi_align(x, torch.ones(3, 4), 2)
    with pytest.raises(ValueError, match=r"boxes\[0\] must be an \[L, 4\] tensor"):
        roi_align(x, [torch.ones(3, 5)], 2)
    with pytest.raises(ValueError, match="output_size must be positive"):
        roi_align(x, torch.tensor([[0.0, 0, 0, 4, 4]]), 0)
    with pytest.raises(ValueError, match="4-D"):
        roi_align(torch.randn(3, 8, 8), torch.tensor([[0.0, 0, 0, 4, 4]]), 2)
    with pytest.raises(TypeError, match="float32, bfloat16 or float64"):
        roi_align(x.half(), torch.tensor([[0.0, 0, 0, 4, 4]]), 2)


def test_the_kernel_runs_at_the_expected_level(isa_level):
    level = ember._C.roi_align_implementation()
    assert level == ("ref" if isa_level == "ref" else "avx2" if isa_level == "avx2" else "avx512")


@pytest.mark.skipif(tv_ops is None, reason="torchvision does not import here")
def test_ember_optimize_swaps_torchvisions_roi_align(gen):
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = tv_ops.RoIAlign(7, 0.25, 2, aligned=True)

        def forward(self, x, rois):
            return self.pool(x, rois)

    x = torch.randn(1, 8, 32, 32, generator=gen)
    rois = random_rois(4, 1, 32, 32, gen, 0.25)
    model = Head().eval()
    expect = model(x, rois)
    optimized = ember.optimize(model)
    assert type(optimized.pool) is RoIAlign and type(model.pool) is tv_ops.RoIAlign
    torch.testing.assert_close(optimized(x, rois), expect, atol=1e-5, rtol=1e-5)
