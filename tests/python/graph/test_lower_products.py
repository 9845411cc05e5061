"""A squeeze-excitation's product onto ember's kernel (ember._optimize.graph.lower_products, product_node): the
product of the features and the scale a fused convolution computed from them is a FusedProduct, torch's product bit
for bit in fp32 and bf16 (any layout, either operand order); a product of other tensors stays torch's; dtypes that
promote, shapes that broadcast both ways and autograd run torch's mul; the product is a step of a replayed segment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes, close
from torch import nn

import ember
from ember._optimize.graph.product_node import FusedProduct
from ember._optimize.graph.replay import ReplaySegment
from ember._optimize.inference import linear


class Excited(nn.Module):
    """A squeeze-excitation block, as torchvision writes it (MobileNetV3's: hardsigmoid), between two convolutions."""

    def __init__(self, order: str = "scale first") -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.project = nn.Conv2d(16, 8, 1)
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        scale = F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        return self.project(scale * x if self.order == "scale first" else x * scale)


class Gated(nn.Module):
    """A product of two computed tensors neither of which is a convolution's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) * torch.tanh(x)


def _products(gm: torch.nn.Module) -> list[FusedProduct]:
    return [m for m in gm.modules() if isinstance(m, FusedProduct)]


@pytest.mark.parametrize("order", ["scale first", "features first"])
def test_the_excitation_product_is_lowered_and_is_torchs(order: str) -> None:
    torch.manual_seed(0)
    model = Excited(order).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        gm = all_passes(model, x)
        assert len(_products(gm)) == 1
        assert close(gm(x), model(x))


def test_a_product_of_other_tensors_stays_torchs() -> None:
    gm = all_passes(Gated().eval(), torch.randn(4, 5))
    assert not _products(gm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_the_kernel_gives_torchs_bits(dtype: torch.dtype, layout: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 5, 7).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    scale = torch.rand(2, 16, 1, 1).to(dtype)
    node = FusedProduct("test")
    with torch.no_grad():
        for a, b in ((x, scale), (scale, x)):
            got = node(a, b)
            expected = a * b
            assert got.dtype == expected.dtype and got.stride() == expected.stride()
            assert torch.equal(got, expected)


def test_other_calls_run_torchs_mul() -> None:
    node = FusedProduct("test")
    x, scale = torch.randn(2, 4, 3, 3), torch.rand(2, 4, 1, 1)
    with torch.no_grad():
        promoted = node(x.bfloat16(), scale)  # bf16 times fp32: torch promotes
        assert promoted.dtype == torch.float32 and torch.equal(promoted, x.bfloat16() * scale)
        both_ways = node(torch.randn(2, 1, 3), torch.randn(1, 4, 1))  # each broadcasts to a third shape
        assert both_ways.shape == (2, 4, 3)
    wanted = x.clone().requires_grad_()
    node(wanted, scale).sum().backward()  # autograd: torch's mul, differentiable
    assert wanted.grad is not None and torch.equal(wanted.grad, scale.expand_as(x))


def test_the_product_is_a_step_of_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: False)
    torch.manual_seed(0)
    model = Excited().eval()
    x = torch.randn(2, 3, 8, 8)
    optimized = ember.optimize(Excited().eval().requires_grad_(False), sample_input=x)
    optimized.load_state_dict(model.state_dict())
    forward = optimized.__dict__["forward"]
    segments = [m for m in getattr(forward, "inner", forward).graph.modules() if isinstance(m, ReplaySegment)]
    assert len(segments) == 1 and any(isinstance(k, FusedProduct) for k in segments[0].kernels)
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):
            torch.testing.assert_close(optimized(x), expected, rtol=1e-5, atol=1e-5)
    assert segments[0].replays == 1, segments[0].refused
