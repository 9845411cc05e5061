"""The BatchNorm pass (ember._optimize.graph.lower_batchnorm): an eval-mode BatchNorm no layer took in (a
pre-activation block's), in module, functional and ATen form, runs on ember's per-channel kernel with the ReLU after
it in the same pass; not that ReLU where another node reads the norm's result; a BatchNorm after a convolution is
still folded into it. Results are the model's (NaN included), a replaced parameter is seen, and the kernel runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, count_calls, fused_layers
from torch import fx, nn

import ember
from ember._optimize.graph import batchnorm_node
from ember._optimize.graph.batchnorm_node import FusedBatchNorm


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_calls(monkeypatch, batchnorm_node, "frozen_batch_norm")


def norms(gm: fx.GraphModule) -> list[FusedBatchNorm]:
    return [m for m in gm.modules() if isinstance(m, FusedBatchNorm)]


def randomized(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    with torch.no_grad():
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)  # type: ignore[operator]
        bn.running_var.uniform_(0.5, 2.0)  # type: ignore[operator]
    return bn


class PreActivation(nn.Module):
    """DenseNet's dense layer: BatchNorm and ReLU over the concatenated features, then the convolution."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        self.norm = randomized(nn.BatchNorm2d(12, affine=affine))
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(12, 8, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.conv(self.relu(self.norm(torch.cat([x, y], 1))))


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)
        self.gamma = nn.Parameter(torch.randn(6))
        self.beta = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(F.batch_norm(x, self.mean, self.var, self.gamma, self.beta, False, 0.1, 1e-3))


class NormReadTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = randomized(nn.BatchNorm2d(6))

    def forward(self, x: torch.Tensor) -> Any:
        y = self.norm(x)
        return torch.relu(y), y.sum()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 4, 9, 9), torch.randn(2, 8, 9, 9)


@pytest.mark.parametrize("affine", [True, False])
def test_a_pre_activation_norm_and_its_relu_run_in_one_pass(affine: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = PreActivation(affine).eval()
    x, y = inputs()
    gm = all_passes(model, (x, y))
    assert [n.relu for n in norms(gm)] == [True]
    assert not any(n.op == "call_module" and n.target == "relu" for n in gm.graph.nodes)
    with torch.no_grad():
        expected = model(x, y)
        for dtype in (torch.float32, torch.bfloat16):
            optimized = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=(x, y))
            tolerance = 1e-4 if dtype == torch.float32 else 0.05
            torch.testing.assert_close(optimized(x, y).float(), expected, rtol=tolerance, atol=tolerance)
    assert kernel_calls[0] >= 2


def test_the_functional_form_and_nan(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 6, 5, 5).contiguous(memory_format=torch.channels_last)
    gm = all_passes(model, x)
    x[1, 2, 3, 4] = float("nan")
    assert [n.relu for n in norms(gm)] == [True]
    with torch.no_grad():
        got, expected = gm(x), model(x)
    assert kernel_calls[0] == 1 and got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert got[1, 2, 3, 4].isnan()


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_the_aten_form_is_lowered() -> None:
    torch.manual_seed(0)
    model = PreActivation().eval()
    x, y = inputs()
    gm = all_passes(model, (x, y), export=True)
    assert [n.relu for n in norms(gm)] == [True]
    with torch.no_grad():
        torch.testing.assert_close(gm(x, y), model(x, y), rtol=1e-4, atol=1e-4)


def test_a_relu_beside_another_reader_stays() -> None:
    model = NormReadTwice().eval()
    x = torch.randn(2, 6, 5, 5)
    gm = all_passes(model, x)
    assert [n.relu for n in norms(gm)] == [False]
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_norm_after_a_convolution_is_still_folded() -> None:
    model = nn.Sequential(nn.Conv2d(3, 6, 3), randomized(nn.BatchNorm2d(6)), nn.ReLU()).eval()

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    gm = all_passes(Wrapped().eval(), torch.randn(1, 3, 8, 8))
    assert norms(gm) == [] and fused_layers(gm)[0].state.bn is not None


def test_a_replaced_parameter_is_seen(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = PreActivation().eval()
    x, y = inputs()
    with torch.no_grad():
        optimized = ember.optimize(model, dtype=torch.float32, graph_mode=True, sample_input=(x, y))
        optimized.norm.weight = nn.Parameter(torch.full((12,), 2.0))
        optimized.norm.running_var.fill_(4.0)  # in place: a buffer's values change under the same tensor
        reference = PreActivation().eval()
        reference.load_state_dict(optimized.state_dict())
        torch.testing.assert_close(optimized(x, y), reference(x, y), rtol=1e-4, atol=1e-4)
