"""Graph mode for the parts of a model whose whole forward does not capture (ember._optimize.graph.submodules): each
submodule that captures on its own, on the inputs it received in a run of ``sample_input``, gets a graph forward;
the report says, submodule by submodule, which path took it or why none did; single layers and modules without
parameters are not tried; the model's results do not change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import assert_matches
from torch import nn

import ember
from ember._optimize.graph.forward import GraphForward


class Stage(nn.Module):
    """conv + BN + ReLU twice, with a residual: a graph of its own."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class Head(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(channels, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x))) * scale


class Branchy(nn.Module):
    """A forward that branches on a tensor's value (no capture of the whole), calling parts that capture."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)  # a single layer: the module rewrite's, not tried
        self.stages = nn.Sequential(Stage(8), Stage(8))
        self.pool = nn.AdaptiveAvgPool2d(1)  # no parameters: not tried
        self.head = Head(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(self.stem(x))
        if y.mean() > 0:  # data-dependent: neither symbolic tracing nor torch.export takes it
            y = y * 2
        return self.head(self.pool(y).flatten(1), scale=0.5)


def _batchnorms_with_statistics(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


def test_the_parts_that_capture_get_a_graph_each(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = _batchnorms_with_statistics(Branchy()).eval()
    x = torch.randn(2, 3, 10, 9)
    optimized = ember.optimize(model, sample_input=x, report=True)
    report = capsys.readouterr().out
    assert "forward not captured" in report
    assert "stages: forward captured by torch.fx symbolic trace" in report
    assert "head: forward captured by torch.fx symbolic trace" in report
    assert "stem:" not in report and "pool:" not in report  # a single layer, a module without parameters
    assert "stages: graph mode: 4 layer(s) on ember's kernels, 4 BatchNorm(s) folded" in report
    assert not isinstance(optimized.__dict__.get("forward"), GraphForward)
    assert isinstance(optimized.stages.__dict__.get("forward"), GraphForward)
    assert isinstance(optimized.head.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, x, 1e-5, 1e-5)
    assert_matches(optimized, model, -torch.rand(3, 3, 6, 7), 1e-5, 1e-5)  # the other branch, other sizes


class Inner(nn.Module):
    """Fails as a whole (a value branch) but holds a Stage, which captures."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = Stage(4)
        self.gain = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stage(x)
        return y * self.gain if float(y.sum()) > 0 else y


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) if x.sum() > -1e9 else x


def test_the_search_descends_below_a_part_that_fails(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = _batchnorms_with_statistics(Outer()).eval()
    x = torch.randn(1, 4, 5, 5)
    optimized = ember.optimize(model, sample_input=x, report=True)
    report = capsys.readouterr().out
    assert "inner: forward not captured" in report
    assert "inner.stage: forward captured by torch.fx symbolic trace" in report
    assert isinstance(optimized.inner.stage.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, x, 1e-5, 1e-5)


def test_without_a_sample_parts_are_traced_when_graph_mode_is_asked_for() -> None:
    torch.manual_seed(0)
    model = _batchnorms_with_statistics(Branchy()).eval()
    optimized = ember.optimize(model, graph_mode=True)
    assert isinstance(optimized.stages.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, torch.randn(2, 3, 8, 8), 1e-5, 1e-5)


def test_graph_mode_false_tries_no_part() -> None:
    model = _batchnorms_with_statistics(Branchy()).eval()
    optimized = ember.optimize(model, sample_input=torch.randn(1, 3, 8, 8), graph_mode=False)
    assert not isinstance(optimized.stages.__dict__.get("forward"), GraphForward)


def test_the_search_stops_at_its_time_budget(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ember._optimize.graph import submodules

    monkeypatch.setattr(submodules, "_BUDGET_S", 0.0)
    torch.manual_seed(0)
    model = _batchnorms_with_statistics(Branchy()).eval()
    x = torch.randn(2, 3, 10, 9)
    optimized = ember.optimize(model, sample_input=x, report=True)
    assert "capturing submodules stopped at its time budget" in capsys.readouterr().out
    assert not isinstance(optimized.stages.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, x, 1e-5, 1e-5)
