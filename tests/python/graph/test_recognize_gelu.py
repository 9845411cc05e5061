"""The written-out tanh GELU (ember._optimize.graph.recognize_gelu): Hugging Face's ``NewGELUActivation`` and
``FastGELUActivation`` and a Megatron-style association become ``F.gelu(x, approximate="tanh")``, which the epilogue
pass fuses into the layer before; a different constant, a missing term or an intermediate value read elsewhere
leave the arithmetic as it is."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, LinearThen, all_passes, captured, close, fused_layers
from torch import nn

from ember._optimize.graph.recognize_gelu import recognize_gelu

Activation = Callable[[torch.Tensor], torch.Tensor]


def new_gelu(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's NewGELUActivation (GPT-2)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def fast_gelu(x: torch.Tensor) -> torch.Tensor:  # Hugging Face's FastGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def megatron_gelu(x: torch.Tensor) -> torch.Tensor:  # another association, the constant first
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def method_gelu(x: torch.Tensor) -> torch.Tensor:  # methods, x³ as x ** 3, 1 added on the right
    return (x * (x.pow(2) * 0.044715 + 1.0) * math.sqrt(2 / math.pi)).tanh().add(1.0).mul(x).mul(0.5)


def wrong_constant(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.04 * torch.pow(x, 3.0))))


def no_cube(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * x))


def other_scale(x: torch.Tensor) -> torch.Tensor:
    return 0.25 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("activation", [new_gelu, fast_gelu, megatron_gelu, method_gelu])
def test_each_written_form_is_one_gelu_in_the_layers_epilogue(activation: Activation) -> None:
    torch.manual_seed(0)
    model = LinearThen(activation).eval()
    x = torch.randn(4, 16) * 3
    with torch.no_grad():
        gm = all_passes(model, x)
        assert [layer.entries for layer in fused_layers(gm)] == [("gelu_tanh",)]
        assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"]
        assert close(gm(x), model(x), rtol=1e-5, atol=2e-6)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_is_recognized() -> None:
    torch.manual_seed(0)
    model = LinearThen(new_gelu).eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        gm = all_passes(model, x, export=True)
        assert [layer.entries for layer in fused_layers(gm)] == [("gelu_tanh",)]
        assert close(gm(x), model(x), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("activation", [wrong_constant, no_cube, other_scale])
def test_other_arithmetic_is_left_alone(activation: Activation) -> None:
    torch.manual_seed(0)
    model = LinearThen(activation).eval()
    x = torch.randn(4, 16)
    gm = captured(model, x)
    before = len(gm.graph.nodes)
    assert recognize_gelu(gm) == 0
    assert len(gm.graph.nodes) == before


class TanhReadTwice(nn.Module):
    """The tanh's value is read outside the pattern: it must be computed, and the pattern stays."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))
        return 0.5 * x * (1.0 + t), t


def test_an_intermediate_value_read_elsewhere_keeps_the_arithmetic() -> None:
    gm = captured(TanhReadTwice(), torch.randn(3, 8))
    assert recognize_gelu(gm) == 0


def test_two_gelus_in_one_graph_and_a_gelu_of_a_sum() -> None:
    """x is any node read by the pattern: here a sum (no layer before it, so the GELU runs as torch's call)."""

    class Two(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return new_gelu(a + b) + fast_gelu(a)

    a, b = torch.randn(5, 7), torch.randn(5, 7)
    gm = captured(Two(), (a, b))
    assert recognize_gelu(gm) == 2
    gelus = [n for n in gm.graph.nodes if n.target is F.gelu]
    assert len(gelus) == 2 and all(n.kwargs == {"approximate": "tanh"} for n in gelus)
    gm.recompile()
    assert close(gm(a, b), Two()(a, b), rtol=1e-5, atol=2e-6)
