"""The scale pass (ember._optimize.graph.fold_scales) and the permuted residual of the epilogue pass: a model tensor
that multiplies a Linear's output channel by channel (a layer scale), directly or through a permutation, is folded
into the Linear's weights, and the residual added after the permutation joins the Linear's epilogue, read in the
Linear's layout; not for a factor that varies along another dimension, a scalar tensor, a factor computed in the
forward, or a Linear whose output something else reads. Results against the model in fp32 and against autocast in
bf16 (with autocast's dtypes: an fp32 scale makes the residual stream fp32), and a changed scale is seen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes, close, fused_layers, graph_forward, within_autocast_error
from torch import nn

import ember
from ember import _C
from ember._optimize.graph.replay import ReplaySegment


class ConvNextBlock(nn.Module):
    """torchvision's CNBlock: depthwise convolution, permute to channels-last, LayerNorm, Linear, GELU, Linear,
    permute back, ``layer_scale * x`` with layer_scale [C, 1, 1], and the block's input added."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.rand(dim, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return self.layer_scale * torch.permute(y, [0, 3, 1, 2]) + x


class Stage(nn.Module):
    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(ConvNextBlock() for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ChannelsLastScale(nn.Module):
    """Hugging Face's ConvNext: the scale [C] multiplies the Linear's output before the permutation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.gamma = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc(x) * self.gamma).permute(0, 3, 1, 2)


def _scaled(gm: torch.fx.GraphModule) -> list[bool]:
    return [layer.state.scale is not None for layer in fused_layers(gm)]


def test_a_layer_scale_after_a_permutation_folds_and_the_residual_joins() -> None:
    torch.manual_seed(0)
    model = ConvNextBlock().eval()
    x = torch.randn(2, 8, 5, 5)
    gm = all_passes(model, x)
    assert _scaled(gm)[-2:] == [False, True]  # fc1, then fc2 with the scale
    fc2 = fused_layers(gm)[-1]
    assert fc2.entries == ("add",) and fc2.operand_permuted == (0, 2, 3, 1)
    assert not any(n.op == "call_function" and n.target is torch.mul for n in gm.graph.nodes)
    with torch.no_grad():
        assert close(gm(x), model(x))


def test_a_scale_before_the_permutation_folds() -> None:
    torch.manual_seed(0)
    model = ChannelsLastScale().eval()
    x = torch.randn(2, 3, 4, 6)
    gm = all_passes(model, x)
    assert _scaled(gm) == [True]
    with torch.no_grad():
        assert close(gm(x), model(x))


class Factor(nn.Module):
    """``factor * permute(fc(x))`` for a factor of any shape, and optionally another reader of fc's output."""

    def __init__(self, factor: torch.Tensor, tapped: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.factor = nn.Parameter(factor)
        self.tapped = tapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        out = self.factor * y.permute(0, 3, 1, 2)
        return out + y.sum() if self.tapped else out


@pytest.mark.parametrize(
    "factor",
    [torch.rand(1, 3, 1) + 0.5, torch.rand(4, 3, 1) + 0.5, torch.rand(()) + 0.5, torch.rand(1, 1, 4, 1, 1) + 0.5],
    ids=["along the height", "channels and height", "a scalar tensor", "a dimension more"],
)
def test_a_factor_that_is_not_per_channel_is_not_folded(factor: torch.Tensor) -> None:
    torch.manual_seed(0)
    model = Factor(factor).eval()
    x = torch.randn(2, 3, 5, 6)
    gm = all_passes(model, x)
    assert _scaled(gm) == [False]
    with torch.no_grad():
        assert close(gm(x), model(x))


def test_another_reader_of_the_linears_output_blocks_the_fold() -> None:
    torch.manual_seed(0)
    model = Factor(torch.rand(4, 1, 1) + 0.5, tapped=True).eval()
    x = torch.randn(2, 3, 5, 6)
    gm = all_passes(model, x)
    assert _scaled(gm) == [False]
    with torch.no_grad():
        assert close(gm(x), model(x), rtol=1e-4)


class ComputedFactor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * x[..., :4].sigmoid()


def test_a_factor_computed_in_the_forward_is_not_folded() -> None:
    torch.manual_seed(0)
    model = ComputedFactor().eval()
    x = torch.randn(3, 6)
    gm = all_passes(model, x)
    assert _scaled(gm) == [False]
    with torch.no_grad():
        assert close(gm(x), model(x))


def test_a_changed_scale_is_seen() -> None:
    torch.manual_seed(0)
    model = ConvNextBlock().eval()
    x = torch.randn(2, 8, 5, 5)
    gm = all_passes(model, x)
    with torch.no_grad():
        gm(x)
        model.layer_scale.mul_(3.0)  # an in-place change: the kernel is built again
        assert close(gm(x), model(x))
        model.layer_scale = nn.Parameter(torch.rand(8, 1, 1))  # a replaced parameter
        assert close(gm(x), model(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stage_replays_as_one_segment_with_autocasts_dtypes(dtype: torch.dtype) -> None:
    """Three blocks end to end through ember.optimize: one replayed segment, the same result as the nodes one by one,
    and (in bf16) autocast's fp32 residual stream and its error."""
    if dtype == torch.bfloat16 and not _C.Linear.supported("bfloat16"):
        pytest.skip("ember's bf16 Linear needs AVX512-BF16 or AMX")
    torch.manual_seed(0)
    model = Stage().eval()
    x = torch.randn(2, 8, 9, 9).contiguous(memory_format=torch.channels_last)
    optimized = ember.optimize(model, dtype=dtype, sample_input=(x,))
    forward = graph_forward(optimized)
    segments = [m for m in forward.graph.modules() if isinstance(m, ReplaySegment)]
    assert len(segments) == 1
    with torch.inference_mode():
        got = optimized(x)
        got = optimized(x)  # replayed
        ReplaySegment.enabled = False
        try:
            nodes = optimized(x)
        finally:
            ReplaySegment.enabled = True
        exact = model(x)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                autocast = model(x)
        except RuntimeError:  # torch 1.13's autocast: LayerNorm on a bf16 activation (what ember's norm kernel takes)
            autocast = None
    assert torch.equal(got, nodes)
    assert got.dtype == torch.float32  # autocast's: the fp32 scale makes the residual stream fp32
    if dtype == torch.float32:
        assert close(got, exact)
    elif autocast is not None:
        assert autocast.dtype == torch.float32
        assert within_autocast_error(got, exact, autocast)
    else:
        assert torch.allclose(got, exact, rtol=5e-2, atol=5e-2 * float(exact.abs().max()))
