"""The lowering pass (ember._optimize.graph.lower): Linears, convolutions and constant-weight matmuls in every form
become fused nodes on ember's kernels that compute what torch does; a weight computed in the forward, or a module
with hooks, stays torch's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, captured, close, exported, fused_layers, lowered
from torch import fx, nn

from ember._optimize.graph.nodes import FusedConv, FusedLinear


class Apply(nn.Module):
    """``function(self, x)``: a one-line model per case."""

    def __init__(self, function: Callable[[nn.Module, torch.Tensor], torch.Tensor], **children: nn.Module) -> None:
        super().__init__()
        self.function = function
        for name, child in children.items():
            self.add_module(name, child)
        self.w = nn.Parameter(torch.randn(12, 10) / 3)
        self.b = nn.Parameter(torch.randn(12))
        self.k = nn.Parameter(torch.randn(6, 2, 3, 3) / 3)  # a grouped 3x3 kernel: 4 input channels in 2 groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self, x)


CASES: dict[str, tuple[Apply, tuple[int, ...], type]] = {
    "nn.Linear": (Apply(lambda m, x: m.fc(x), fc=nn.Linear(10, 12)), (3, 10), FusedLinear),
    "nn.Linear, 3-D input": (Apply(lambda m, x: m.fc(x), fc=nn.Linear(10, 12)), (2, 5, 10), FusedLinear),
    "nn.Linear without bias": (Apply(lambda m, x: m.fc(x), fc=nn.Linear(10, 12, bias=False)), (3, 10), FusedLinear),
    "F.linear": (Apply(lambda m, x: F.linear(x, m.w, m.b)), (4, 10), FusedLinear),
    "x @ W": (Apply(lambda m, x: x @ m.wt), (4, 12), FusedLinear),
    "torch.matmul(x, W)": (Apply(lambda m, x: torch.matmul(x, m.wt)), (2, 3, 12), FusedLinear),
    "torch.addmm (Conv1D)": (Apply(lambda m, x: torch.addmm(m.bt, x, m.wt)), (5, 12), FusedLinear),
    "nn.Conv2d": (Apply(lambda m, x: m.conv(x), conv=nn.Conv2d(4, 6, 3, stride=2, padding=1)), (2, 4, 9, 8), FusedConv),
    "nn.Conv1d": (Apply(lambda m, x: m.conv(x), conv=nn.Conv1d(4, 6, 5, dilation=2)), (2, 4, 20), FusedConv),
    "nn.Conv3d": (Apply(lambda m, x: m.conv(x), conv=nn.Conv3d(4, 6, 3, padding=1)), (1, 4, 5, 6, 5), FusedConv),
    "reflect padding": (
        Apply(lambda m, x: m.conv(x), conv=nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect")),
        (2, 4, 7, 7),
        FusedConv,
    ),
    "nn.ConvTranspose2d": (
        Apply(lambda m, x: m.up(x), up=nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)),
        (2, 4, 5, 6),
        FusedConv,
    ),
    "F.conv2d, groups": (Apply(lambda m, x: F.conv2d(x, m.k, None, 1, 1, 1, 2)), (2, 4, 8, 8), FusedConv),
    "F.conv2d, padding same": (Apply(lambda m, x: F.conv2d(x, m.k, padding="same", groups=2)), (2, 4, 8, 7), FusedConv),
    "F.conv2d, stride 2": (Apply(lambda m, x: F.conv2d(x, m.k, stride=2, groups=2)), (2, 4, 9, 9), FusedConv),
}
ATEN_CASES = [
    "nn.Linear, 3-D input",
    "F.linear",
    "x @ W",
    "torch.addmm (Conv1D)",
    "nn.Conv2d",
    "nn.ConvTranspose2d",
    "F.conv2d, groups",
]
for _model, _, _ in CASES.values():
    _model.register_buffer("wt", torch.randn(12, 7) / 3)
    _model.register_buffer("bt", torch.randn(7))


def _check(gm: fx.GraphModule, model: nn.Module, shape: tuple[int, ...], kind: type) -> None:
    assert lowered(model, gm)
    assert [type(layer) for layer in fused_layers(gm)] == [kind]
    torch.manual_seed(1)
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x)
        assert close(gm(x), expected)
        assert close(gm(x), expected)  # the second call runs on the kernel built by the first


@pytest.mark.parametrize("case", CASES)
def test_each_layer_form_is_lowered(case: str) -> None:
    model, shape, kind = CASES[case]
    _check(captured(model.eval()), model, shape, kind)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize("case", ATEN_CASES)
def test_the_aten_forms_are_lowered(case: str) -> None:
    model, shape, kind = CASES[case]
    _check(exported(model.eval(), torch.randn(*shape)), model, shape, kind)


def test_a_weight_computed_in_the_forward_stays_in_torch() -> None:
    model = Apply(lambda m, x: F.linear(x, m.w * 2, m.b)).eval()
    gm = captured(model)
    assert lowered(model, gm) == []


def test_a_module_with_a_hook_stays_in_torch() -> None:
    model = Apply(lambda m, x: m.fc(x), fc=nn.Linear(10, 12)).eval()
    model.fc.register_forward_hook(lambda module, args, out: out * 2)
    gm = captured(model)
    assert lowered(model, gm) == []


def test_a_parameter_replaced_after_lowering_is_read() -> None:
    torch.manual_seed(0)
    model = Apply(lambda m, x: m.fc(x), fc=nn.Linear(10, 12)).eval()
    gm = captured(model)
    lowered(model, gm)
    x = torch.randn(3, 10)
    with torch.no_grad():
        gm(x)
        model.fc.weight = nn.Parameter(torch.randn(12, 10))
        assert close(gm(x), model(x))


def test_autograd_runs_torchs_operations() -> None:
    torch.manual_seed(0)
    model = Apply(lambda m, x: F.relu(F.linear(x, m.w, m.b))).eval()
    gm = captured(model)
    lowered(model, gm)
    x = torch.randn(3, 10, requires_grad=True)
    gm(x).sum().backward()
    expected_grad = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    assert torch.allclose(x.grad, expected_grad)


def test_a_scaled_addmm_stays_in_torch() -> None:
    model = Apply(lambda m, x: torch.addmm(m.bt, x, m.wt, beta=0.5)).eval()
    model.register_buffer("wt", torch.randn(12, 7))
    model.register_buffer("bt", torch.randn(7))
    assert lowered(model, captured(model)) == []
