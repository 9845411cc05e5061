"""The in-place residual pass (ember._optimize.graph.accumulate_in_place): a fused convolution adds its residual in
place, into the residual's own memory, where that memory is another fused layer's output that nothing reads after
it; never where the residual is the model's input, is read after the convolution, is shared by a view, or is the
convolution's own input. In place or not, the results are the graph's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes, fused_layers, graph_forward
from torch import nn

import ember
from ember import _C
from ember._optimize.graph.nodes import FusedConv

# The pass is the same for every compute dtype; bf16 where the CPU has ember's bf16 convolutions (AVX512-BF16 or
# AMX), fp32 elsewhere, so that an AVX2 machine tests the marks too rather than finding no fused convolution.
COMPUTE = torch.bfloat16 if _C.Convolution.supported("bfloat16") else torch.float32


class Block(nn.Module):
    """A residual block whose identity is another convolution's output (a ResNet block after its stem)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = F.relu(self.stem(x))
        return F.relu(self.conv2(F.relu(self.conv1(identity))) + identity)


class InputResidual(nn.Module):
    """The residual is the model's input: the caller's tensor, never written."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv2(F.relu(self.conv1(x))) + x)


class ReadAfter(Block):
    """The identity is returned too: read after the convolution that adds it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        identity = F.relu(self.stem(x))
        return F.relu(self.conv2(F.relu(self.conv1(identity))) + identity), identity


class SharedByAView(Block):
    """A view of the identity is taken before the convolution and read after it: the two share memory."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        identity = F.relu(self.stem(x))
        flat = identity.flatten(1)
        return F.relu(self.conv2(F.relu(self.conv1(identity))) + identity), flat


class OwnInput(Block):
    """The convolution reads the residual as its input as well."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = F.relu(self.stem(x))
        return self.conv2(identity) + identity


def _marked(model: nn.Module, x: torch.Tensor) -> list[bool]:
    gm = all_passes(model.eval(), x, COMPUTE)
    return [layer.accumulates_into_operand for layer in fused_layers(gm) if isinstance(layer, FusedConv)]


def test_a_residual_another_layer_wrote_and_nothing_reads_after_is_marked() -> None:
    torch.manual_seed(0)
    assert _marked(Block(), torch.randn(2, 3, 8, 8)) == [False, False, True]


@pytest.mark.parametrize(
    ("model", "channels"),
    [(InputResidual(), 8), (ReadAfter(), 3), (SharedByAView(), 3), (OwnInput(), 3)],
    ids=["the model's input", "read after", "shared by a view", "the convolution's own input"],
)
def test_a_residual_others_can_see_is_not_marked(model: nn.Module, channels: int) -> None:
    torch.manual_seed(0)
    marks = _marked(model, torch.randn(2, channels, 8, 8))
    assert marks and not any(marks)  # (convolutions fused, none marked)


def _optimized(model: nn.Module, x: torch.Tensor, in_place: bool = True) -> nn.Module:
    """``ember.optimize`` of the model in COMPUTE; ``in_place=False``: with the pass's marks taken back (the fast calls,
    built from the marks on the calls ember.optimize made, are dropped and built again on the next call)."""
    optimized = ember.optimize(copy.deepcopy(model).eval(), dtype=COMPUTE, sample_input=x)
    if not in_place:
        for layer in graph_forward(optimized).graph.modules():
            if isinstance(layer, FusedConv):
                layer.accumulates_into_operand = False
                layer.state.cache.fast = None
    return optimized


def _marks(optimized: nn.Module) -> list[bool]:
    return [m.accumulates_into_operand for m in graph_forward(optimized).graph.modules() if isinstance(m, FusedConv)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_in_place_the_results_are_the_graphs(channels_last: bool) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 8, 8)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    in_place, apart = _optimized(model, x), _optimized(model, x, in_place=False)
    assert _marks(in_place) == [False, False, True] and not any(_marks(apart))
    with torch.no_grad():
        got = [in_place(x) for _ in range(3)]
        expected = apart(x)
    for g in got:  # (the sum post-op adds bias and residual in another order: a bf16 rounding apart)
        torch.testing.assert_close(g, expected, rtol=1 / 128, atol=1 / 128)


def test_the_callers_input_is_never_written() -> None:
    torch.manual_seed(0)
    model = InputResidual().eval()
    x = torch.randn(2, 8, 8, 8).to(COMPUTE).to(memory_format=torch.channels_last)  # the output's dtype and layout
    before = x.clone()
    optimized = _optimized(model, x)
    with torch.no_grad():
        for _ in range(3):
            optimized(x)
    assert torch.equal(x, before)


def test_a_residual_returned_too_is_returned_as_it_was() -> None:
    torch.manual_seed(0)
    model = ReadAfter().eval()
    x = torch.randn(2, 3, 8, 8)
    optimized = _optimized(model, x)
    with torch.no_grad():
        for _ in range(2):
            out, identity = optimized(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=torch.bfloat16 == COMPUTE):
            expected_out, expected_identity = model(x)
    torch.testing.assert_close(identity.float(), expected_identity.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.float(), expected_out.float(), rtol=3e-2, atol=3e-2)
