"""The 1-D layout pass (ember._optimize.graph.channels_last_1d): fused 1-D convolutions read and write [N, C, W]
channels-last where every reader of their output takes any strides (another convolution, a permutation, a norm),
and keep torch's contiguous layout where one may not (a ``view``, the graph's output) and for one input channel.
Results against the model in fp32 and against autocast in bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes, close, fused_layers, within_autocast_error
from torch import nn

from ember import _C
from ember._optimize.graph.nodes import FusedConv


class AudioStem(nn.Module):
    """Whisper's encoder stem: two convolutions with GELUs, then the frames permuted to [N, W, C] and normalized."""

    def __init__(self, first_channels: int = 8, norm: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(first_channels, 16, 3, padding=1)
        self.conv2 = nn.Conv1d(16, 16, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(16) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        return self.norm(x.permute(0, 2, 1) * 2)


class Viewed(nn.Module):
    """A convolution's output viewed (which needs torch's contiguous layout), and one returned as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3)
        self.head = nn.Conv1d(6, 6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y.view(y.shape[0], -1), self.head(y)


def _channels_last(gm: torch.fx.GraphModule) -> list[bool]:
    return [layer.geometry.channels_last_1d for layer in fused_layers(gm) if isinstance(layer, FusedConv)]


def test_convolutions_read_by_convolutions_and_a_permutation_go_channels_last() -> None:
    torch.manual_seed(0)
    model = AudioStem().eval()
    x = torch.randn(2, 8, 20)
    gm = all_passes(model, x)
    assert _channels_last(gm) == [True, True]
    with torch.no_grad():
        assert close(gm(x), model(x))
    conv2 = [layer for layer in fused_layers(gm) if isinstance(layer, FusedConv)][1]
    with torch.no_grad():
        out = conv2(F.gelu(model.conv1(x)))
    assert out.stride(1) == 1 and out.permute(0, 2, 1).is_contiguous()


def test_a_viewed_output_the_graphs_output_and_one_input_channel_keep_torchs_layout() -> None:
    torch.manual_seed(0)
    model = Viewed().eval()
    x = torch.randn(2, 4, 9)
    gm = all_passes(model, x)
    assert _channels_last(gm) == [False, False]  # viewed; returned
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x)):
            assert close(got, expected) and got.is_contiguous()
    mono = AudioStem(first_channels=1).eval()
    gm = all_passes(mono, torch.randn(1, 1, 40))
    assert _channels_last(gm) == [False, True]


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 layers need AVX512-BF16 or AMX")
def test_bf16_with_strides_and_padding_stays_within_autocasts_error() -> None:
    torch.manual_seed(0)
    model = AudioStem(norm=False).eval()  # (torch 1.13's autocast refuses a LayerNorm on a bf16 activation)
    x = torch.randn(2, 8, 33)
    gm = all_passes(model, x, compute=torch.bfloat16)
    assert _channels_last(gm) == [True, True]
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = gm(x)
            autocast = model(x)
        exact = model(x)
    assert within_autocast_error(got, exact, autocast)
