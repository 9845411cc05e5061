"""The constant-folding pass (ember._optimize.graph.fold_constants): a weight transform computed from the model's
tensors alone is kept rather than computed per call, and a layer whose weight it is runs on ember's kernel; the
kept value follows the tensors it reads; a value that reads an input, a tensor the graph writes, or only views no
layer reads stays torch's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, captured, close, exported, fused_layers
from torch import fx, nn

from ember._optimize.graph.fold_constants import fold_constants
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.nodes import FusedConv, FusedLinear
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands


class Apply(nn.Module):
    """``function(self, x)`` over a weight held transposed, a bias, a scale and a relative-position table."""

    def __init__(self, function: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.function = function
        self.wt = nn.Parameter(torch.randn(10, 12) / 3)  # [in, out]
        self.b = nn.Parameter(torch.randn(12))
        self.scale = nn.Parameter(torch.rand(12) + 0.5)
        self.table = nn.Parameter(torch.randn(9, 2))  # (2 * 3 - 1)^2 offsets of a 3 x 3 window, 2 heads
        coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")).flatten(1)
        offsets = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + 2
        self.register_buffer("index", (offsets[..., 0] * 3 + offsets[..., 1]).clamp(max=8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self, x)


def folded(gm: fx.GraphModule) -> list[FoldedConstant]:
    return [m for m in gm.modules() if isinstance(m, FoldedConstant)]


def swin_bias(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Swin's relative-position bias, gathered from its table on every call, added to attention scores x."""
    bias = m.table[m.index.view(-1)].view(9, 9, -1).permute(2, 0, 1).contiguous()
    return x + bias


CASES: dict[str, tuple[Callable[[nn.Module, torch.Tensor], torch.Tensor], tuple[int, ...], int, list[type]]] = {
    "transposed weight, scaled bias": (lambda m, x: F.linear(x, m.wt.t(), m.b * 2), (3, 10), 2, [FusedLinear]),
    "weight .T, scaled": (lambda m, x: F.linear(x, m.wt.T * m.scale[:, None], m.b), (2, 4, 10), 1, [FusedLinear]),
    "Gemma's 1 + weight": (lambda m, x: F.layer_norm(x, (12,), 1 + m.scale, m.b), (3, 12), 1, []),
    "relative-position bias": (swin_bias, (2, 2, 9, 9), 1, []),
}


@pytest.mark.parametrize("case", CASES)
def test_a_transform_of_the_models_tensors_is_kept_and_its_layer_lowered(case: str) -> None:
    function, shape, count, layers = CASES[case]
    model = Apply(function).eval()
    gm = all_passes(model)
    assert len(folded(gm)) == count
    assert [type(layer) for layer in fused_layers(gm)] == layers
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x)
        assert close(gm(x), expected)
        kept = [m.value for m in folded(gm)]
        assert close(gm(x), expected)
        assert all(m.value is value for m, value in zip(folded(gm), kept))  # kept, not computed again
    assert not [key for key in gm.state_dict() if "folded" in key]  # no kept value in the state


def test_the_kept_value_follows_the_tensors_it_reads() -> None:
    model = Apply(lambda m, x: F.linear(x, m.wt.t() * m.scale[:, None], m.b)).eval()
    gm = all_passes(model)
    x = torch.randn(5, 10)
    with torch.no_grad():
        gm(x)
        model.scale.mul_(3)  # in place: its version counter
        assert close(gm(x), model(x))
        model.load_state_dict({**model.state_dict(), "wt": torch.randn(10, 12)})
        assert close(gm(x), model(x))
        model.wt = nn.Parameter(torch.randn(10, 12))  # replaced
        assert close(gm(x), model(x))


def test_autograd_reaches_the_parameters_through_the_transform() -> None:
    model = Apply(lambda m, x: torch.tanh(F.linear(x, m.wt.t() * 2, m.b))).eval()
    gm = all_passes(model)
    x = torch.randn(4, 10)
    with torch.no_grad():
        gm(x)  # a value kept first, without autograd
    gm(x).sum().backward()
    got = model.wt.grad.clone()
    model.wt.grad = None
    model(x).sum().backward()
    assert torch.allclose(got, model.wt.grad)


def test_a_value_kept_under_inference_mode_serves_a_call_with_autograd() -> None:
    model = Apply(lambda m, x: F.linear(x, m.wt.t() * 2, m.b)).eval()
    gm = all_passes(model)
    x = torch.randn(4, 10)
    with torch.inference_mode():
        gm(x)
    for p in model.parameters():
        p.requires_grad_(False)
    y = gm(x.requires_grad_())
    y.sum().backward()
    assert torch.allclose(x.grad, (model.wt * 2).sum(1).expand(4, 10))


NOT_FOLDED: dict[str, tuple[Callable[[nn.Module, torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "reads the input": (lambda m, x: F.linear(x, m.wt.t() * x.mean(), m.b), (3, 10)),
    "reads a size of the input": (lambda m, x: x + m.b.repeat(x.shape[0] // 3 + 1)[:12], (3, 12)),
    "only views, read by an add": (lambda m, x: x + m.wt.t(), (12, 10)),
}


@pytest.mark.parametrize("case", NOT_FOLDED)
def test_what_is_not_constant_or_not_worth_keeping_stays_torchs(case: str) -> None:
    function, shape = NOT_FOLDED[case]
    model = Apply(function).eval()
    gm = captured(model)
    assert fold_constants(gm, TensorOperands(model, gm)) == 0
    x = torch.randn(*shape)
    with torch.no_grad():
        assert close(gm(x), model(x))


class Counting(nn.Module):
    """Writes its buffer in place on every call: a value computed from it is not a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return F.linear(x, self.w * self.calls)


def counting_graph(model: Counting) -> fx.GraphModule:
    """Counting's forward as a graph. (Written out: FX's symbolic trace runs a buffer's in-place update once, while
    tracing, rather than recording it.)"""
    graph = fx.Graph()
    x = graph.placeholder("x")
    calls = graph.get_attr("calls")
    graph.call_method("add_", (calls, 1))
    weight = graph.call_function(torch.mul, (graph.get_attr("w"), graph.get_attr("calls")))
    graph.output(graph.call_function(F.linear, (x, weight)))
    return fx.GraphModule(model, graph)


def test_a_tensor_the_graph_writes_is_not_folded() -> None:
    model = Counting().eval()
    gm = counting_graph(model)
    assert fold_constants(gm, TensorOperands(model, gm)) == 0
    reference = Counting().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(3):
            assert close(gm(x), reference(x))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_weight_norm_of_a_convolution_is_kept_and_the_convolution_lowered() -> None:
    torch.manual_seed(0)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2)
    model = nn.Sequential(conv, nn.GELU()).eval()
    x = torch.randn(2, 8, 16)
    gm = exported(model, (x,))
    counts = run_passes(gm, TensorOperands(model, gm), torch.float32, replay=False)
    assert counts.constants == 1
    assert [type(layer) for layer in fused_layers(gm)] == [FusedConv]
    with torch.no_grad():
        assert close(gm(x), model(x), rtol=1e-5, atol=1e-6)
        model[0].parametrizations.weight.original0.mul_(2)  # the norm g
        assert close(gm(x), model(x), rtol=1e-5, atol=1e-6)
