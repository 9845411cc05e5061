"""ember.nn.functional's pools against torch's on every ISA path. max_pool2d / MaxPool2d against torch's in float64
(a max is exact, so the results must be equal, NaN where torch has NaN): random geometries, channel counts, padded
pixel strides, NaN and infinities; the kernel seen to run where it should and torch's path elsewhere (row-major,
float16, return_indices, autograd), the operator under torch.compile, bad geometry. avg_pool2d / AvgPool2d equal
to torch's to the bit (the same float32 summation order) and within float64's reference; adaptive_avg_pool2d /
AdaptiveAvgPool2d on the kernel where the output divides the input."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember
from ember import _C
from ember._optimize import scripting
from ember.nn import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from ember.nn import pooling as pooling_module
from ember.nn.functional import adaptive_avg_pool2d, avg_pool2d, max_pool2d

HAS_COMPILE = hasattr(torch, "compile") and hasattr(torch.library, "register_fake")


@pytest.fixture
def pool_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """How many times the pooling module calls each of ember's kernels (counted, then run)."""
    calls: dict[str, list[int]] = {}

    def counting(name: str) -> Any:
        calls[name] = [0]
        real = getattr(_C, name)

        def counted(*args: Any) -> None:
            calls[name][0] += 1
            real(*args)

        return counted

    fake_c = types.SimpleNamespace(max_pool2d=counting("max_pool2d"), avg_pool2d=counting("avg_pool2d"))
    monkeypatch.setattr(pooling_module, "_C", fake_c)
    return calls


@pytest.fixture
def kernel_calls(pool_calls: dict[str, list[int]]) -> list[int]:
    return pool_calls["max_pool2d"]


@pytest.fixture
def avg_calls(pool_calls: dict[str, list[int]]) -> list[int]:
    return pool_calls["avg_pool2d"]


def with_specials(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x with a few NaN, +inf and -inf at random positions."""
    flat = x.view(-1) if x.is_contiguous() else x.permute(0, 2, 3, 1).reshape(-1)
    count = max(1, flat.numel() // 50)
    where = torch.randint(0, flat.numel(), (3, count), generator=gen)
    with torch.no_grad():
        for row, value in zip(where, (float("nan"), float("inf"), float("-inf"))):
            flat[row] = value
    return x if x.is_contiguous() else flat.view(x.shape[0], x.shape[2], x.shape[3], x.shape[1]).permute(0, 3, 1, 2)


def reference(x: torch.Tensor, *args: Any, relu: bool = False) -> torch.Tensor:
    out = F.max_pool2d(x.double(), *args)
    return torch.relu(out) if relu else out


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0, equal_nan=True)


@st.composite
def geometries(draw: st.DrawFn) -> tuple[Any, ...]:
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, kernel[0] // 2)), draw(st.integers(0, kernel[1] // 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    ceil_mode = draw(st.booleans())
    height = draw(st.integers(dilation[0] * (kernel[0] - 1) + 1, 12))
    width = draw(st.integers(dilation[1] * (kernel[1] - 1) + 1, 12))
    return kernel, stride, padding, dilation, ceil_mode, height, width


@settings(max_examples=60, deadline=None)
@given(
    geometry=geometries(),
    channels=st.sampled_from([1, 3, 16, 19, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    specials=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_the_kernel_gives_torchs_max_pool(geometry: tuple[Any, ...], channels: int, dtype: torch.dtype,
                                          specials: bool, seed: int) -> None:  # fmt: skip
    kernel, stride, padding, dilation, ceil_mode, height, width = geometry
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, channels, height, width, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    if specials:
        x = with_specials(x, gen)
    got = max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
    assert_same(got, reference(x, kernel, stride, padding, dilation, ceil_mode))
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("relu", [False, True])
def test_every_isa_path_with_and_without_the_relu(isa_level: str, dtype: torch.dtype, relu: bool,
                                                  gen: torch.Generator) -> None:  # fmt: skip
    """ResNet's stem pool and a ceil-mode, dilated one over channel counts off the vector widths, with NaN and
    infinities; the ReLU applied to the pooled values is the ReLU before the pool."""
    for channels in (5, 16, 64, 67):
        x = torch.randn(3, channels, 15, 13, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        x = with_specials(x, gen)
        for args in (([3, 3], [2, 2], [1, 1], [1, 1], False), ([3, 2], [2, 1], [1, 0], [2, 3], True)):
            got = pooling_module.max_pool2d_on_kernel(x, *args, relu=relu)
            assert got is not None
            assert_same(got, reference(x, *args, relu=relu))
            assert_same(got, F.max_pool2d(torch.relu(x) if relu else x, *args).double())


def test_padded_pixels_and_a_sliced_input(kernel_calls: list[int], gen: torch.Generator) -> None:
    """Channels of stride 1 are all the kernel needs: a channel slice of a wider channels-last tensor (pixels
    padded) and a cropped one run on it."""
    wide = torch.randn(2, 40, 20, 20, generator=gen).contiguous(memory_format=torch.channels_last)
    for x in (wide[:, 3:35], wide[:, :, 2:17, 1:19]):
        assert_same(max_pool2d(x, 3, 2, 1), reference(x, 3, 2, 1))
    assert kernel_calls[0] == 2


def test_an_unbatched_input_and_one_channel(kernel_calls: list[int], gen: torch.Generator) -> None:
    x = torch.randn(8, 9, 9, generator=gen).permute(1, 2, 0).contiguous().permute(2, 0, 1)  # [C, H, W], C inner
    assert_same(max_pool2d(x, 2), reference(x, 2))
    one = torch.randn(2, 1, 9, 9, generator=gen)  # row-major, and channels-last too with one channel
    assert_same(max_pool2d(one, 3, 1, 1), reference(one, 3, 1, 1))
    assert kernel_calls[0] == 2


def test_other_inputs_take_torchs_max_pool(kernel_calls: list[int], gen: torch.Generator) -> None:
    """Row-major, float16 and float64 inputs, return_indices and an input that wants a gradient: torch's results
    (and gradient), without the kernel."""
    x = torch.randn(2, 8, 9, 9, generator=gen)
    assert_same(max_pool2d(x, 3, 2, 1), reference(x, 3, 2, 1))
    for dtype in (torch.float16, torch.float64):
        y = x.to(dtype).contiguous(memory_format=torch.channels_last)
        try:
            expected = F.max_pool2d(y, 2)
        except RuntimeError:  # torch 1.13 has no channels-last float16 pool: ember passes on torch's error
            with pytest.raises(RuntimeError):
                max_pool2d(y, 2)
            continue
        assert torch.equal(max_pool2d(y, 2), expected)
    cl = x.contiguous(memory_format=torch.channels_last)
    values, indices = max_pool2d(cl, 2, return_indices=True)
    want_values, want_indices = F.max_pool2d(cl, 2, return_indices=True)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    leaf = cl.clone().requires_grad_()
    max_pool2d(leaf, 3, 2, 1).sum().backward()
    expected = cl.clone().requires_grad_()
    F.max_pool2d(expected, 3, 2, 1).sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, expected.grad)
    assert kernel_calls[0] == 0
    with torch.no_grad():
        max_pool2d(leaf, 2)
    assert kernel_calls[0] == 1  # without autograd the kernel takes it


def test_the_module_is_torchs_with_the_kernel(kernel_calls: list[int], gen: torch.Generator) -> None:
    pool, theirs = (
        MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
        nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
    )
    x = torch.randn(2, 16, 11, 11, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    assert torch.equal(pool(x), theirs(x))
    assert repr(pool) == repr(theirs) and pool.state_dict() == theirs.state_dict() == {}
    assert isinstance(pool, nn.MaxPool2d) and kernel_calls[0] == 1


@pytest.mark.parametrize(
    "args",
    [(3, 1, 2), (0,), (3, 0), (3, 1, -1), (3, 1, 1, 0), (5, 1, 0, 1)],
    ids=["padding-past-half", "kernel-0", "stride-0", "negative-padding", "dilation-0", "no-whole-window"],
)
def test_bad_geometry_raises_a_value_error(args: tuple[int, ...]) -> None:
    x = torch.randn(1, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="max_pool2d"):
        max_pool2d(x, *args)


@pytest.mark.parametrize("pool", [max_pool2d, avg_pool2d], ids=["max", "average"])
@pytest.mark.parametrize("args", [(0,), (2, 0), (2, -1)], ids=["kernel-0", "stride-0", "negative-stride"])
@pytest.mark.parametrize("shape", [(0, 0, 0), (1, 3, 4, 4)], ids=["empty", "row-major"])
def test_a_window_torch_refuses_is_refused_by_name_on_any_input(pool: Any, args: tuple[int, ...],
                                                               shape: tuple[int, ...]) -> None:  # fmt: skip
    """Inputs the kernel does not take go to torch's pool, whose words for these vary (torch 2.11 on an empty input:
    "integer out of range"); ember names the pool and the argument first."""
    with pytest.raises(ValueError, match=f"{pool.__name__}: (kernel_size|stride) must be positive"):
        pool(torch.randn(shape), *args)


def test_a_bad_pair_raises_a_value_error() -> None:
    x = torch.randn(1, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="kernel_size"):
        max_pool2d(x, (2, 2, 2))


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with registered fake kernels: torch >= 2.4")
def test_the_operator_compiles_and_traces(gen: torch.Generator) -> None:
    x = torch.randn(2, 16, 10, 10, generator=gen).contiguous(memory_format=torch.channels_last)

    def f(t: torch.Tensor) -> torch.Tensor:
        return max_pool2d(t, 3, 2, 1, ceil_mode=True) * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert_same(compiled(x), reference(x, 3, 2, 1, 1, True) * 2)
    traced = torch.fx.symbolic_trace(f)
    op = torch.ops.ember.max_pool2d
    assert any(n.target in (op, op.default) for n in traced.graph.nodes)
    assert_same(traced(x), reference(x, 3, 2, 1, 1, True) * 2)
    if hasattr(torch.library, "opcheck"):
        torch.library.opcheck(torch.ops.ember.max_pool2d.default, (x, [3, 3], [2, 2], [1, 1], [1, 1], True, True))


def test_ember_exports_it() -> None:
    assert ember.nn.functional.max_pool2d is max_pool2d and ember.nn.MaxPool2d is MaxPool2d


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.conv(x))))


def test_the_module_rewrite_runs_max_pools_on_the_kernel(kernel_calls: list[int], gen: torch.Generator) -> None:
    """ember.optimize without a graph: nn.MaxPool2d keeps its class and gets ember's forward (as nn.AvgPool2d and
    nn.AdaptiveAvgPool2d do); torch.jit.script compiles torch's, pickling keeps the forward, train mode runs torch's
    pool."""
    import pickle
    import warnings

    torch.manual_seed(0)
    model = SmallCnn().eval()
    x = torch.randn(2, 3, 16, 16, generator=gen)
    with torch.no_grad():
        expected = model(x)
        optimized = ember.optimize(model, dtype=torch.float32, graph_mode=False)
        assert type(optimized.pool) is nn.MaxPool2d
        torch.testing.assert_close(optimized(x), expected, rtol=1e-5, atol=1e-5)
        assert kernel_calls[0] == 1
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
            warnings.simplefilter("ignore")
            patch.setattr(scripting, "_warned", True)  # the once-a-process note stays for test_regressions
            scripted = torch.jit.script(optimized)
        torch.testing.assert_close(scripted(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pickle.loads(pickle.dumps(optimized))(x), expected, rtol=1e-5, atol=1e-5)
        assert kernel_calls[0] == 2
    optimized.train()
    optimized(x).sum().backward()
    assert kernel_calls[0] == 2


# --- average pooling -------------------------------------------------------------------------------------------------


@st.composite
def average_geometries(draw: st.DrawFn) -> tuple[Any, ...]:
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, kernel[0] // 2)), draw(st.integers(0, kernel[1] // 2)))
    height, width = draw(st.integers(kernel[0], 12)), draw(st.integers(kernel[1], 12))
    return kernel, stride, padding, draw(st.booleans()), draw(st.booleans()), height, width


@settings(max_examples=60, deadline=None)
@given(geometry=average_geometries(), channels=st.sampled_from([1, 3, 16, 19, 64]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), divisor=st.sampled_from([None, 1, 7]),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_the_average_is_torchs_to_the_bit(geometry: tuple[Any, ...], channels: int, dtype: torch.dtype,
                                          divisor: int | None, seed: int) -> None:  # fmt: skip
    """torch's channels-last kernel sums each window in float32 in the order ember's does and divides once."""
    kernel, stride, padding, ceil_mode, include_pad, height, width = geometry
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, channels, height, width, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    got = avg_pool2d(x, kernel, stride, padding, ceil_mode, include_pad, divisor)
    expected = F.avg_pool2d(x, kernel, stride, padding, ceil_mode, include_pad, divisor)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, expected)
    reference = F.avg_pool2d(x.double(), kernel, stride, padding, ceil_mode, include_pad, divisor)
    torch.testing.assert_close(got.double(), reference, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_isa_path_averages(isa_level: str, dtype: torch.dtype, gen: torch.Generator) -> None:
    for channels in (5, 16, 64, 67):
        x = torch.randn(3, channels, 15, 13, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        for args in ((3, 2, 1, False, True, None), (2, 2, 0, True, False, None), (3, 1, 1, False, False, 4)):
            assert torch.equal(avg_pool2d(x, *args), F.avg_pool2d(x, *args))


def test_adaptive_averages_that_divide_run_on_the_kernel(avg_calls: list[int], gen: torch.Generator) -> None:
    """A global pool (and any output size dividing the input's) runs on the kernel: the average over fixed windows,
    torch's adaptive windows then; torch computes a float32 global pool as a mean (another summation order), so
    within float32 rounding there. Other output sizes take torch's."""
    calls = avg_calls
    for dtype in (torch.float32, torch.bfloat16):
        calls[0] = 0
        x = torch.randn(2, 70, 14, 12, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        # torch's global pool is a mean in its own order (torch 1.13's bf16 one rounds as it goes).
        rtol = 2e-7 if dtype == torch.float32 else 2**-7
        for size in (1, (1, 1), (7, 6), (None, 3), (2, None)):
            torch.testing.assert_close(adaptive_avg_pool2d(x, size), F.adaptive_avg_pool2d(x, size),
                                       rtol=rtol, atol=1e-7)  # fmt: skip
        assert calls[0] == 5
        torch.testing.assert_close(adaptive_avg_pool2d(x, (5, 5)), F.adaptive_avg_pool2d(x, (5, 5)))
        assert calls[0] == 5  # 14 x 12 into 5 x 5: torch's windows overlap, torch's pool


def test_a_global_pool_at_batch_one_spreads_its_channels(gen: torch.Generator) -> None:
    x = torch.randn(1, 1152, 7, 7, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(adaptive_avg_pool2d(x, 1))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(results[0], results[1])
    torch.testing.assert_close(results[0], F.adaptive_avg_pool2d(x, 1), rtol=2**-7, atol=1e-7)


def test_average_modules_and_fallbacks(gen: torch.Generator) -> None:
    x = torch.randn(2, 16, 12, 12, generator=gen)
    cl = x.contiguous(memory_format=torch.channels_last)
    for ours, theirs in ((AvgPool2d(3, 2, 1, ceil_mode=True), nn.AvgPool2d(3, 2, 1, ceil_mode=True)),
                         (AdaptiveAvgPool2d((3, 4)), nn.AdaptiveAvgPool2d((3, 4)))):  # fmt: skip
        assert repr(ours) == repr(theirs) and ours.state_dict() == theirs.state_dict() == {}
        for t in (x, cl, cl.bfloat16(), x.double()):
            torch.testing.assert_close(ours(t), theirs(t), rtol=2e-7, atol=1e-7)
    leaf = cl.clone().requires_grad_()
    avg_pool2d(leaf, 3, 2, 1).sum().backward()
    expected = cl.clone().requires_grad_()
    F.avg_pool2d(expected, 3, 2, 1).sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, expected.grad)
    with pytest.raises(ValueError, match="divisor_override"):
        avg_pool2d(cl, 2, divisor_override=0)
    with pytest.raises(ValueError, match="avg_pool2d"):
        avg_pool2d(cl, 3, 1, 2)  # padding past half the kernel


def test_the_module_rewrite_runs_average_pools_on_the_kernel(avg_calls: list[int], gen: torch.Generator) -> None:
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.transition = nn.AvgPool2d(2)
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pool(self.transition(self.conv(x))).flatten(1)

    calls = avg_calls
    model = Head().eval()
    x = torch.randn(2, 3, 16, 16, generator=gen)
    with torch.no_grad():
        optimized = ember.optimize(model, dtype=torch.float32, graph_mode=False)
        assert type(optimized.transition) is nn.AvgPool2d and "forward" in optimized.pool.__dict__
        torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-6)
    assert calls[0] == 2
