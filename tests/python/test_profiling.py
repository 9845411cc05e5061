"""ember's kernels appear in torch.profiler under their own names (ember::<kernel>), and only while it records."""

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import ember
from ember import _profiling


def _names(prof):
    return {event.key for event in prof.key_averages()}


def test_no_range_without_a_profiler():
    assert isinstance(_profiling.kernel_range("x"), type(_profiling._NOTHING))


def test_kernels_are_named_in_a_profile():
    p = nn.Parameter(torch.randn(64))
    p.grad = torch.randn(64)
    opt = ember.optim.Adam([p])
    conv = ember.optimize(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval())
    x = torch.randn(1, 3, 16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ember.bf16.round(torch.randn(100))
        ember.bf16.split(torch.randn(100))
        ember.nn.functional.dropout(torch.randn(100), 0.5, training=True)
        opt.step()
        ember.nn.functional.interaction(torch.randn(2, 4), torch.randn(2, 4))
        with torch.no_grad():
            conv(x)
    names = _names(prof)
    expected = {"ember::bf16_round", "ember::bf16_split", "ember::dropout", "ember::adam_step", "ember::interaction",
                "ember::convolution"}  # fmt: skip
    assert expected <= names, expected - names
