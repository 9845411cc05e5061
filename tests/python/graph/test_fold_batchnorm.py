"""The BatchNorm pass (ember._optimize.graph.fold_batchnorm): a BatchNorm with running statistics after a Linear or
convolution is folded into its weights, in module, functional and ATen form; not where it normalizes with the
batch's statistics, after a transposed convolution, or when the layer's output has another user."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, close, fused_layers
from torch import nn


def randomized(bn: nn.Module) -> nn.Module:
    """Statistics and affine parameters far from the identity, so a fold that is wrong shows."""
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean"):
            getattr(bn, name).uniform_(-1.5, 1.5)
        bn.running_var.uniform_(0.3, 3.0)  # type: ignore[operator]
    return bn


class ConvBn(nn.Module):
    def __init__(self, dims: int = 2) -> None:
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        norm = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]
        self.conv = conv(4, 8, 3, padding=1)
        self.bn = randomized(norm(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class FunctionalBn(nn.Module):
    """Batch norm as a function over buffers the model registers itself (training=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.register_buffer("mean", torch.randn(5))
        self.register_buffer("var", torch.rand(5) + 0.5)
        self.gamma = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.fc(x), self.mean, self.var, self.gamma, None, False, 0.1, 1e-3)


def _folded(gm: torch.fx.GraphModule) -> list[bool]:
    return [layer.state.bn is not None for layer in fused_layers(gm)]


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_a_convolutions_batchnorm_is_folded(dims: int) -> None:
    torch.manual_seed(0)
    model = ConvBn(dims).eval()
    x = torch.randn(2, 4, *([6] * dims))
    gm = all_passes(model, x)
    assert _folded(gm) == [True]
    assert fused_layers(gm)[0].entries == ("relu",)  # the activation after the BatchNorm still joins
    with torch.no_grad():
        assert close(gm(x), model(x))


def test_a_functional_batch_norm_after_a_linear_is_folded() -> None:
    torch.manual_seed(0)
    model = FunctionalBn().eval()
    x = torch.randn(7, 6)
    gm = all_passes(model, x)
    assert _folded(gm) == [True]
    with torch.no_grad():
        assert close(gm(x), model(x))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_batch_norm_is_folded() -> None:
    torch.manual_seed(0)
    model = ConvBn().eval()
    x = torch.randn(2, 4, 6, 6)
    gm = all_passes(model, x, export=True)
    assert _folded(gm) == [True]
    with torch.no_grad():
        assert close(gm(x), model(x))


def test_changed_statistics_are_seen() -> None:
    torch.manual_seed(0)
    model = ConvBn().eval()
    x = torch.randn(2, 4, 6, 6)
    gm = all_passes(model, x)
    with torch.no_grad():
        gm(x)
        model.bn.running_mean.add_(0.5)  # an in-place change: the kernel is built again
        assert close(gm(x), model(x))


class BatchStatistics(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.fc(x), None, None, training=True)


def test_a_batch_norm_over_the_batch_is_not_folded() -> None:
    torch.manual_seed(0)
    model = BatchStatistics().eval()
    x = torch.randn(7, 6)
    gm = all_passes(model, x)
    assert _folded(gm) == [False]
    with torch.no_grad():
        assert close(gm(x), model(x))


class Transposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 2, stride=2)
        self.bn = randomized(nn.BatchNorm2d(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.up(x))


def test_a_transposed_convolutions_batchnorm_is_not_folded() -> None:
    torch.manual_seed(0)
    model = Transposed().eval()
    x = torch.randn(1, 4, 5, 5)
    gm = all_passes(model, x)
    assert _folded(gm) == [False]
    with torch.no_grad():
        assert close(gm(x), model(x))


class Tapped(nn.Module):
    """The convolution's output is also returned: folding would change it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 1)
        self.bn = randomized(nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return self.bn(y), y


def test_a_second_user_of_the_layers_output_blocks_the_fold() -> None:
    torch.manual_seed(0)
    model = Tapped().eval()
    x = torch.randn(2, 4, 5, 5)
    gm = all_passes(model, x)
    assert _folded(gm) == [False]
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x)):
            assert close(got, expected)
