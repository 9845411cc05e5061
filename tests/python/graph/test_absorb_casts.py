"""The cast pass (ember._optimize.graph.absorb_casts): a conversion to float32 whose only readers are bf16 layers,
as their input, is taken into them; the numbers are the graph's own, on the kernel and on torch's path. Not for
fp32 layers, a conversion with more than a dtype, or a converted value read elsewhere (returned, or a residual)."""

from __future__ import annotations

import copy

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, captured, exported
from torch import fx, nn

from ember import _C
from ember._optimize.graph import passes
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands

pytestmark = pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="no bf16 layers on this CPU")


class CastsBetween(nn.Module):
    """T5's MLP: the hidden activation converted to the output projection's weight dtype before it."""

    def __init__(self, read_elsewhere: bool = False, copy: bool = False) -> None:
        super().__init__()
        self.wi = nn.Linear(16, 32)
        self.wo = nn.Linear(32, 16)
        self.read_elsewhere = read_elsewhere
        self.copy = copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.wi(x))
        h = h.to(torch.float32, copy=True) if self.copy else h.to(torch.float32)
        out = self.wo(h)
        return out + h.sum(-1, keepdim=True) if self.read_elsewhere else out


def _passes(
    model: nn.Module, x: torch.Tensor, compute: torch.dtype, export: bool, absorb: bool = True
) -> fx.GraphModule:
    gm = exported(model, (x,)) if export else captured(model, x)
    real = passes.absorb_casts
    if not absorb:
        passes.absorb_casts = lambda gm: 0  # type: ignore[assignment]
    try:
        run_passes(gm, TensorOperands(model, gm), compute, replay=False)
    finally:
        passes.absorb_casts = real
    return gm


def _conversions(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.target in ("to", "float") or "aten.to" in str(n.target)
               or "_to_copy" in str(n.target))  # fmt: skip


def _forms() -> list[bool]:
    return [False, pytest.param(True, marks=pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="no torch.export here"))]


@pytest.mark.parametrize("export", _forms(), ids=["symbolic", "export"])
def test_a_conversion_only_bf16_layers_read_is_taken_into_them(export: bool) -> None:
    torch.manual_seed(0)
    model = CastsBetween().eval()
    x = torch.randn(3, 5, 16)
    gm = _passes(model, x, torch.bfloat16, export)
    before = _passes(copy.deepcopy(model), x, torch.bfloat16, export, absorb=False)
    assert _conversions(gm) == 0 and _conversions(before) == 1
    layers = [m for m in gm.modules() if isinstance(m, FusedLayer)]
    assert [layer.input_cast for layer in layers] == [None, torch.float32]
    with torch.no_grad():
        assert torch.equal(gm(x), before(x))  # bit for bit: bf16 -> fp32 -> bf16 gives back the bf16 value
    # torch's path (autograd on) converts first, as the graph did
    with torch.enable_grad():
        expected = before(x)
        got = gm(x)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize(
    ("compute", "model"),
    [
        (torch.float32, CastsBetween()),  # fp32 layers: the conversion is the graph's, not the kernel's
        (torch.bfloat16, CastsBetween(read_elsewhere=True)),  # the fp32 value is read beside the layer
        (torch.bfloat16, CastsBetween(copy=True)),  # a conversion that does more than convert: not taken
    ],
    ids=["fp32-layers", "read-elsewhere", "copy"],
)
def test_a_conversion_stays_where_its_value_matters(compute: torch.dtype, model: nn.Module) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    gm = _passes(model.eval(), x, compute, export=False)
    assert _conversions(gm) == 1
    assert all(m.input_cast is None for m in gm.modules() if isinstance(m, FusedLayer))


class CastIntoResidual(nn.Module):
    """The converted value is the residual a layer adds, not its input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).float()
        return self.b(x) + h


def test_a_conversion_read_as_a_residual_stays() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    gm = _passes(CastIntoResidual().eval(), x, torch.bfloat16, export=False)
    assert _conversions(gm) == 1
