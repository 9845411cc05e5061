"""Layouts through a rewritten CNN graph: ember's convolutions run channels-last, and the elementwise operations and
pools between them (torch's) keep that layout, so the only reorder of a forward is the model's input, once; no
activation is copied between two ember layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import close
from torch import nn

import ember
from ember import _C


class Stages(nn.Module):
    """Convolutions with BatchNorm and ReLU, a max pool, a residual block, a strided convolution, a depthwise one."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(self.stem(x), 2)
        y = F.relu(self.b(F.relu(self.a(y))) + y)
        return F.hardswish(self.depthwise(self.down(y)))


def _copies(model: nn.Module, x: torch.Tensor, calls: int) -> int:
    with torch.no_grad(), torch.profiler.profile() as prof:
        for _ in range(calls):
            model(x)
    return sum(
        e.count for e in prof.key_averages() if e.key == "aten::copy_"
    )  # (a reorder: contiguous -> clone -> copy_)


def test_only_the_input_is_reordered() -> None:
    if not _C.Convolution.supported("float32"):
        pytest.skip("oneDNN has no fp32 convolution here")
    torch.manual_seed(0)
    model = Stages().eval()
    x = torch.randn(2, 3, 16, 16)
    optimized = ember.optimize(model, sample_input=x)
    with torch.no_grad():
        assert close(optimized(x), model(x), rtol=1e-4, atol=1e-4)
        out = optimized(x)
    assert out.is_contiguous(memory_format=torch.channels_last)  # ember's layout, as torch's channels-last models give
    assert _copies(optimized, x, 3) <= 3  # the NCHW input to channels-last, once a forward
    assert _copies(optimized, x.contiguous(memory_format=torch.channels_last), 3) == 0
