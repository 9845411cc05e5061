"""The written-out quick GELU (ember._optimize.graph.recognize_quick_gelu): ``x * sigmoid(c * x)`` in any operand
order becomes a SiLU between two scales, which the epilogue pass fuses into the layer before it; a scale that is
no constant, a sigmoid of something else or a value read elsewhere leave the arithmetic as it is."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, LinearThen, all_passes, captured, close, fused_layers
from torch import nn

from ember._optimize.graph.recognize_quick_gelu import recognize_quick_gelu

Activation = Callable[[torch.Tensor], torch.Tensor]


def quick_gelu(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's QuickGELUActivation (CLIP)
    return x * torch.sigmoid(1.702 * x)


def quick_gelu_swapped(x: torch.Tensor) -> torch.Tensor:  # the sigmoid first, the scale after x, as methods
    return x.mul(1.702).sigmoid() * x


def swish_of_one(x: torch.Tensor) -> torch.Tensor:  # c = 1: a SiLU
    return x * torch.sigmoid(x * 1.0)


def _reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's result in float64 (on a copy: the fused graph reads the model's own weights)."""
    return copy.deepcopy(model).double()(x.double()).float()


@pytest.mark.parametrize(
    ("activation", "entries"),
    [
        (quick_gelu, ("affine(1.702, 0)", "silu", f"affine({1 / 1.702!r}, 0)")),
        (quick_gelu_swapped, ("affine(1.702, 0)", "silu", f"affine({1 / 1.702!r}, 0)")),
        (swish_of_one, ("affine(1.0, 0)", "silu")),
    ],
    ids=["quick gelu", "operands swapped", "c = 1"],
)
def test_each_written_form_joins_the_layers_epilogue(activation: Activation, entries: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    model = LinearThen(activation).eval()
    x = torch.randn(4, 16) * 3
    with torch.no_grad():
        gm = all_passes(model, x)
        assert [layer.entries for layer in fused_layers(gm)] == [entries]
        assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"]
        assert close(gm(x), _reference(model, x), rtol=1e-5, atol=2e-6)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_is_recognized() -> None:
    torch.manual_seed(0)
    model = LinearThen(quick_gelu).eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        gm = all_passes(model, x, export=True)
        assert len(fused_layers(gm)) == 1 and "silu" in fused_layers(gm)[0].entries
        assert close(gm(x), _reference(model, x), rtol=1e-5, atol=2e-6)


class ScaledByInput(nn.Module):
    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(c * x)


class SigmoidOfAnother(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * y)


class SigmoidReadTwice(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.sigmoid(1.702 * x)
        return x * s, s


class ScaledReadTwice(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = 1.702 * x
        return x * torch.sigmoid(scaled), scaled


@pytest.mark.parametrize(
    "model",
    [ScaledByInput(), SigmoidOfAnother(), SigmoidReadTwice(), ScaledReadTwice()],
    ids=lambda m: type(m).__name__,
)
def test_other_arithmetic_is_left_alone(model: nn.Module) -> None:
    inputs = (torch.randn(3, 8), torch.randn(3, 8))
    gm = captured(model, inputs)
    before = [n.target for n in gm.graph.nodes]
    assert recognize_quick_gelu(gm) == 0
    assert [n.target for n in gm.graph.nodes] == before


def test_a_quick_gelu_with_no_layer_before_it_runs_as_torchs_calls() -> None:
    class OfASum(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return quick_gelu(a + b)

    a, b = torch.randn(5, 7), torch.randn(5, 7)
    gm = captured(OfASum(), (a, b))
    assert recognize_quick_gelu(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(F.silu) == 1
    assert close(gm(a, b), quick_gelu(a + b), rtol=1e-5, atol=2e-6)
