"""The pooling pass (ember._optimize.graph.lower_pooling): max pools in module, functional, torch and ATen form onto
ember's kernel, a ReLU before one taken in (the convolution's epilogue then has none), not where the ReLU has
another reader or writes a tensor another node reads; a pool returning indices stays torch's. Average and adaptive
average pools in every form onto the average kernel (a ReLU before them stays the convolution's); an adaptive
output that does not divide the input runs torch's. Results are the model's own, NaN included, and the kernels are
seen to run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, count_calls, fused_layers
from torch import fx, nn

import ember
from ember._optimize.graph.pool_node import FusedAdaptiveAvgPool, FusedAvgPool, FusedMaxPool
from ember.nn import pooling as pooling_module


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_calls(monkeypatch, pooling_module, "max_pool2d")


def pools(gm: fx.GraphModule) -> list[FusedMaxPool]:
    return [m for n in gm.graph.nodes if n.op == "call_module" and isinstance(m := gm.get_submodule(str(n.target)),
                                                                             FusedMaxPool)]  # fmt: skip


class Stem(nn.Module):
    """ResNet's: convolution, batch norm, in-place ReLU, 3x3/2 max pool, and a layer after it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.head = nn.Conv2d(16, 8, 1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.maxpool(self.relu(self.bn(self.conv(x)))))


class Functional(nn.Module):
    """F.max_pool2d and torch.max_pool2d after F.relu, as a functional model writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(F.relu(self.conv(x)), kernel_size=2)
        return torch.max_pool2d(y, [3, 3], [1, 1], [1, 1], [1, 1], True)


class ReluReadTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> Any:
        r = torch.relu(self.conv(x))
        return F.max_pool2d(r, 2), r.sum()


class InPlaceReluOfASharedValue(nn.Module):
    """relu_ writes y, which the add also reads (rectified): the ReLU must stay."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.conv(x)
        r = y.relu_()
        return F.max_pool2d(r, 2), y + 1


class WithIndices(nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return F.max_pool2d(x, 2, return_indices=True)


def test_the_stems_pool_takes_its_relu_and_runs_on_the_kernel(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Stem().eval()
    x = torch.randn(2, 3, 32, 32)
    gm = all_passes(model, x)
    assert [(p.kernel, p.stride, p.padding, p.relu) for p in pools(gm)] == [([3, 3], [2, 2], [1, 1], True)]
    assert fused_layers(gm)[0].entries == ()  # the convolution writes no ReLU of its own
    assert not any(n.op == "call_module" and n.target == "relu" for n in gm.graph.nodes)
    with torch.no_grad():
        expected = model(x)
        for dtype in (torch.float32, torch.bfloat16):
            optimized = ember.optimize(model, dtype=dtype, graph_mode=True)
            got = optimized(x)
            tolerance = 1e-4 if dtype == torch.float32 else 0.05
            torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)
    # In bf16 the pool runs on the kernel where ember's bf16 convolution hands it a channels-last input; without
    # AVX512-BF16 torch's convolution under autocast computes it, row-major, and torch's pool follows.
    assert kernel_calls[0] == (2 if ember._C.Convolution.supported("bfloat16") else 1)


def test_nan_and_infinities_pass_as_they_do_in_torch() -> None:
    """A NaN in the convolution's input reaches the pooled output as torch's ReLU and pool pass it on; -inf and
    +inf too."""
    torch.manual_seed(0)
    model = Stem().eval()
    x = torch.randn(1, 3, 32, 32)
    x[0, 0, 5, 5], x[0, 1, 20, 20], x[0, 2, 10, 25] = float("nan"), float("inf"), float("-inf")
    with torch.no_grad():
        expected = model(x)
        got = ember.optimize(model, dtype=torch.float32, graph_mode=True)(x)
    assert torch.equal(got.isnan(), expected.isnan()) and got.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_functional_forms_are_lowered(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 4, 12, 12)
    gm = all_passes(model, x)
    assert [(p.kernel, p.stride, p.ceil_mode, p.relu) for p in pools(gm)] == [
        ([2, 2], [2, 2], False, True),
        ([3, 3], [1, 1], True, False),
    ]
    assert fused_layers(gm)[0].entries == ()
    with torch.no_grad():
        torch.testing.assert_close(ember.optimize(model, dtype=torch.float32, graph_mode=True)(x), model(x),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
    assert kernel_calls[0] == 2


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_the_aten_form_is_lowered() -> None:
    torch.manual_seed(0)
    model = Stem().eval()
    x = torch.randn(2, 3, 32, 32)
    gm = all_passes(model, x, export=True)
    assert [(p.kernel, p.relu) for p in pools(gm)] == [([3, 3], True)]
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_class", [ReluReadTwice, InPlaceReluOfASharedValue])
def test_a_relu_another_node_sees_stays(model_class: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = model_class().eval()
    x = torch.randn(2, 4, 8, 8)
    gm = all_passes(model, x)
    assert [p.relu for p in pools(gm)] == [False]
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x)):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_pool_returning_indices_stays_torchs() -> None:
    x = torch.randn(1, 4, 8, 8)
    gm = all_passes(WithIndices(), x)
    assert pools(gm) == []
    values, indices = gm(x)
    assert torch.equal(values, F.max_pool2d(x, 2))
    assert torch.equal(indices, F.max_pool2d(x, 2, return_indices=True)[1])


def test_a_row_major_input_takes_torchs_pool(kernel_calls: list[int]) -> None:
    """The model's input, pooled before any convolution: row-major, so torch's pool and ReLU run."""

    class PoolFirst(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.max_pool2d(torch.relu(x), 2)

    x = torch.randn(2, 4, 8, 8)
    gm = all_passes(PoolFirst(), x)
    assert [p.relu for p in pools(gm)] == [True]
    assert torch.equal(gm(x), F.max_pool2d(torch.relu(x), 2))
    assert kernel_calls[0] == 0
    cl = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(gm(cl), F.max_pool2d(torch.relu(cl), 2))
    assert kernel_calls[0] == 1


class Averages(nn.Module):
    """DenseNet's transition (a module), Inception's branch pool (a function), a squeeze-excitation's and a head's
    global pools (a function and a module)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 3, padding=1)
        self.transition = nn.AvgPool2d(2, 2)
        self.head = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.transition(torch.relu(self.conv(x)))
        y = F.avg_pool2d(y, 3, 1, 1, count_include_pad=False)
        y = y * torch.sigmoid(F.adaptive_avg_pool2d(y, 1))
        return self.fc(torch.flatten(self.head(y), 1))


@pytest.mark.parametrize("export", [False, True], ids=["symbolic trace", "export"])
def test_average_pools_are_lowered(export: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if export and not HAS_EXPORT_AUTO:
        pytest.skip("torch.export with automatic dynamic sizes")
    torch.manual_seed(0)
    model = Averages().eval()
    x = torch.randn(2, 4, 12, 12)
    gm = all_passes(model, x, export=export)
    kinds = [type(m).__name__ for m in gm.modules() if isinstance(m, (FusedAvgPool, FusedAdaptiveAvgPool))]
    assert sorted(kinds) == ["FusedAdaptiveAvgPool", "FusedAdaptiveAvgPool", "FusedAvgPool", "FusedAvgPool"]
    assert fused_layers(gm)[0].entries == ("relu",)  # an average does not take the ReLU before it
    calls = count_calls(monkeypatch, pooling_module, "avg_pool2d")
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            optimized = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=x)
            tolerance = 1e-4 if dtype == torch.float32 else 0.05
            torch.testing.assert_close(optimized(x).float(), model(x), rtol=tolerance, atol=tolerance)
    assert calls[0] >= 8  # four pools a forward, in both dtypes


def test_an_adaptive_pool_to_sizes_that_do_not_divide_runs_torchs() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.adaptive_avg_pool2d(x, (5, 5))

    x = torch.randn(2, 8, 14, 12).contiguous(memory_format=torch.channels_last)
    gm = all_passes(Odd(), x)
    assert [type(m).__name__ for m in gm.modules() if isinstance(m, FusedAdaptiveAvgPool)] == ["FusedAdaptiveAvgPool"]
    assert torch.equal(gm(x), F.adaptive_avg_pool2d(x, (5, 5)))
