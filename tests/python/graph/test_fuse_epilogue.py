"""The epilogue pass (ember._optimize.graph.fuse_epilogue): elementwise chains, a residual add and a gated MLP's
product after a layer run in its kernel's epilogue, in every form torch records them; a user of an intermediate
value stops the chain."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, close, fused_layers
from torch import nn

from ember import _C

Activation = Callable[[torch.Tensor], torch.Tensor]

# Each activation the kernels apply, in the forms a model writes it: module, function, tensor method.
ACTIVATIONS: dict[str, tuple[Activation, str]] = {
    "relu module": (nn.ReLU(), "relu"),
    "relu function": (F.relu, "relu"),
    "relu method": (lambda x: x.relu(), "relu"),
    "relu in place": (nn.ReLU(inplace=True), "relu"),
    "gelu erf": (nn.GELU(), "gelu"),
    "gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh"),
    "silu": (F.silu, "silu"),
    "sigmoid": (torch.sigmoid, "sigmoid"),
    "sigmoid method": (lambda x: x.sigmoid(), "sigmoid"),
    "tanh": (nn.Tanh(), "tanh"),
    "hardswish": (nn.Hardswish(), "hardswish"),
    "hardsigmoid": (F.hardsigmoid, "hardsigmoid"),
    "mish": (nn.Mish(), "mish"),
    "elu": (nn.ELU(alpha=0.7), "elu(0.7)"),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), "leaky_relu(0.2)"),
    "relu6": (nn.ReLU6(), "clamp(0.0, 6.0)"),
    "hardtanh": (nn.Hardtanh(-2.0, 3.0), "clamp(-2.0, 3.0)"),
    "clamp min": (lambda x: torch.clamp(x, min=-0.5), "clamp(-0.5, inf)"),
    "clamp method": (lambda x: x.clamp(-1, 1), "clamp(-1.0, 1.0)"),
    "times a constant": (lambda x: x * 0.5, "affine(0.5, 0)"),
    "constant times": (lambda x: 3 * x, "affine(3.0, 0)"),
    "plus a constant": (lambda x: x + 1.25, "affine(1, 1.25)"),
}


class Then(nn.Module):
    """A layer, then ``activation``."""

    def __init__(self, layer: nn.Module, activation: Activation) -> None:
        super().__init__()
        self.layer = layer
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.layer(x))


def _check(model: nn.Module, x: torch.Tensor, entries: list[tuple[str, ...]], export: bool = False) -> None:
    with torch.no_grad():
        expected = model.eval()(x)
        gm = all_passes(model, x, export=export)
        assert [layer.entries for layer in fused_layers(gm)] == entries
        assert close(gm(x), expected)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_each_activation_joins_a_linear(name: str) -> None:
    torch.manual_seed(0)
    activation, entry = ACTIVATIONS[name]
    _check(Then(nn.Linear(16, 24), activation), torch.randn(5, 16) * 3, [(entry,)])


@pytest.mark.parametrize("name", ["relu module", "gelu tanh", "hardswish", "relu6", "times a constant"])
def test_activations_join_a_convolution(name: str) -> None:
    torch.manual_seed(0)
    activation, entry = ACTIVATIONS[name]
    _check(Then(nn.Conv2d(3, 8, 3, padding=1), activation), torch.randn(2, 3, 9, 7), [(entry,)])


class Chain(nn.Module):
    """Linear, ReLU, a scale, the residual add and a GELU after it: the whole chain is one kernel call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.relu(self.fc(x)) * 0.5 + x)


def test_a_chain_with_a_residual_add_is_one_call() -> None:
    torch.manual_seed(0)
    _check(Chain(), torch.randn(4, 3, 16), [("relu", "affine(0.5, 0)", "add", "gelu")])


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_fuses_the_same_chain() -> None:
    torch.manual_seed(0)
    _check(Chain(), torch.randn(4, 3, 16), [("relu", "affine(0.5, 0)", "add", "gelu")], export=True)


class ResidualAfter(nn.Module):
    """The residual is computed after the layer: the fused call moves to where both exist."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.other = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        r = torch.tanh(x) * 2  # not a layer's output
        return self.other(y + r)


def test_a_residual_computed_after_the_layer() -> None:
    torch.manual_seed(0)
    _check(ResidualAfter(), torch.randn(6, 8), [("add",), ()])


class Branches(nn.Module):
    """The layer's output is used twice: neither user can join it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return torch.relu(h), h * 2


def test_a_second_user_of_the_output_stops_the_chain() -> None:
    torch.manual_seed(0)
    model = Branches().eval()
    x = torch.randn(3, 8)
    gm = all_passes(model, x)
    assert [layer.entries for layer in fused_layers(gm)] == [()]
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x)):
            assert close(got, expected)


class UsedMidChain(nn.Module):
    """The value after the ReLU is used again: the ReLU joins, what follows it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        return torch.sigmoid(h) + h


def test_a_user_of_an_intermediate_value_stops_the_chain_there() -> None:
    torch.manual_seed(0)
    _check(UsedMidChain(), torch.randn(3, 8), [("relu",)])


class NotSteps(nn.Module):
    """What the epilogue cannot hold: a tensor product, a scaled add, a softmax, a second residual."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.randn(8))
        self.case = case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.case == "tensor product":
            return y * self.scale
        if self.case == "scaled add":
            return torch.add(y, x, alpha=2)
        if self.case == "softmax":
            return torch.softmax(y, -1)
        return (y + x) + torch.sin(x)  # a second residual: the first joins, the second does not


@pytest.mark.parametrize(
    ("case", "entries"),
    [("tensor product", ()), ("scaled add", ()), ("softmax", ()), ("second residual", ("add",))],
)
def test_what_the_epilogue_does_not_hold_stays_in_torch(case: str, entries: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    _check(NotSteps(case), torch.randn(4, 8), [entries])


def test_a_residual_of_another_shape_runs_in_torch() -> None:
    """A broadcasting residual joins the graph's node but the kernel refuses it at run time: torch adds it."""

    class Broadcast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + r

    torch.manual_seed(0)
    model = Broadcast().eval()
    x, r = torch.randn(4, 8), torch.randn(8)
    gm = all_passes(model, (x, r))
    assert [layer.entries for layer in fused_layers(gm)] == [("add",)]
    with torch.no_grad():
        assert close(gm(x, r), model(x, r))
        r_full = torch.randn(4, 8)
        assert close(gm(x, r_full), model(x, r_full))


class GatedMLP(nn.Module):
    """Llama's MLP, ``down(act(gate(x)) * up(x))``; ``gate_first=False`` computes the up projection first."""

    def __init__(self, act: Activation = F.silu, gate_first: bool = True, width: int = 16, hidden: int = 40) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)
        self.act = act
        self.gate_first = gate_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_first:
            return self.down(self.act(self.gate(x)) * self.up(x))
        up = self.up(x)
        return self.down(up * self.act(self.gate(x)))


@pytest.mark.parametrize(("name", "entry"), [("silu", "silu"), ("gelu tanh", "gelu_tanh"), ("relu module", "relu")])
def test_a_gated_mlp_multiplies_in_the_gate_projections_epilogue(name: str, entry: str) -> None:
    """act(x W1) * (x W3): the gate's kernel applies the activation and multiplies by the up projection's output,
    which it reads as its operand (the gate's call moves after the up projection's)."""
    torch.manual_seed(0)
    activation, _ = ACTIVATIONS[name]
    _check(GatedMLP(activation), torch.randn(2, 5, 16), [(), (entry, "mul"), ()])


def test_a_gated_mlp_written_up_first() -> None:
    """With the up projection first, the up projection's output is the factor the gate multiplies by all the same
    (a symbolic trace records no shapes: a fused Linear reading the same input with as many outputs is one of the
    output's shape)."""
    torch.manual_seed(0)
    _check(GatedMLP(gate_first=False), torch.randn(7, 16), [(), ("silu", "mul"), ()])


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_fuses_the_gated_product() -> None:
    torch.manual_seed(0)
    _check(GatedMLP(), torch.randn(2, 5, 16), [(), ("silu", "mul"), ()], export=True)


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
def test_a_gated_mlp_computes_in_bf16_within_autocasts_error() -> None:
    torch.manual_seed(0)
    model = GatedMLP(width=64, hidden=96).eval()
    x = torch.randn(3, 9, 64)
    with torch.no_grad():
        gm = all_passes(model, x, compute=torch.bfloat16)
        assert [layer.entries for layer in fused_layers(gm)] == [(), ("silu", "mul"), ()]
        got = gm(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(x)
        expected = model(x)
    # Three bf16 roundings of the activations (each Linear's input, the product) on either side.
    assert got.dtype == autocast.dtype == torch.bfloat16
    err, ref = (got.float() - expected).abs().max(), (autocast.float() - expected).abs().max()
    assert err <= 2 * ref + 1e-3, (err, ref)


class ScaledBy(nn.Module):
    """A product the epilogue must not take: a factor that broadcasts (a squeeze-excitation's per-channel scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        scale = torch.sigmoid(self.fc(y.mean((2, 3), keepdim=True)))
        return y * scale


@pytest.mark.parametrize(
    "export", [False, pytest.param(True, marks=pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="no Dim.AUTO"))]
)
def test_a_broadcast_factor_stays_in_torch(export: bool) -> None:
    torch.manual_seed(0)
    _check(ScaledBy(), torch.randn(2, 4, 6, 5), [(), ("sigmoid",)], export=export)


class GateReadTwice(nn.Module):
    """The activated gate is read again: the activation joins the gate, and the up projection multiplies by it."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = F.silu(self.mlp.gate(x))
        return self.mlp.down(g * self.mlp.up(x))[..., :8] + g[..., :8]


def test_a_second_reader_of_the_activated_gate() -> None:
    torch.manual_seed(0)
    _check(GateReadTwice(), torch.randn(3, 16), [("silu",), ("mul",), ()])


class FlattenedRows(nn.Module):
    """Hugging Face's Conv1D: rows flattened for the GEMM, restored after it, then the residual added."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        y = self.fc(x.view(-1, 16)).view(x.shape)
        return y + residual


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_a_residual_after_the_rows_are_restored_joins_where_shapes_are_recorded() -> None:
    torch.manual_seed(0)
    model = FlattenedRows().eval()
    x, residual = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        gm = all_passes(model, (x, residual), export=True)
        [layer] = fused_layers(gm)
        assert layer.entries == ("add",) and layer.operand_reshaped
        assert close(gm(x, residual), model(x, residual))
        other = torch.randn(3, 7, 16), torch.randn(3, 7, 16)  # other sizes through the same graph
        assert close(gm(*other), model(*other))
        wide = torch.randn(3, 7, 16).transpose(0, 1)  # a residual laid out otherwise: read as it is
        assert close(
            gm(other[0].transpose(0, 1).contiguous(), wide), model(other[0].transpose(0, 1).contiguous(), wide)
        )


def test_without_recorded_shapes_the_residual_after_a_reshape_stays_torchs() -> None:
    torch.manual_seed(0)
    model = FlattenedRows().eval()
    x, residual = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        gm = all_passes(model, (x, residual))
        assert [layer.entries for layer in fused_layers(gm)] == [()]
        assert close(gm(x, residual), model(x, residual))
