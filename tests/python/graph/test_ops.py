"""ember._graph.ops: one name and one set of operands for an operation, whichever form the graph recorded it in
(module call, functional call, tensor method, ATen operator)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from ember._graph.ops import ACTIVATIONS, call_of, constant

HAS_EXPORT_AUTO = hasattr(getattr(torch, "export", None), "Dim") and hasattr(torch.export.Dim, "AUTO")


class Modules(nn.Module):
    """The vocabulary as modules: conv, batch norm, activations, linear, a residual add, layer norm, a scalar mul."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.linear = nn.Linear(8, 8)
        self.gelu = nn.GELU(approximate="tanh")
        self.norm = nn.LayerNorm(8, eps=1e-6)
        self.silu = nn.SiLU()
        self.relu6 = nn.ReLU6()
        self.leaky = nn.LeakyReLU(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.conv(x))).mean((2, 3))
        z = self.gelu(self.linear(y)) + y
        return self.leaky(self.relu6(self.silu(self.norm(z)))) * 2.0


class Functional(nn.Module):
    """The vocabulary as functions and tensor methods."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.bias = nn.Parameter(torch.randn(4))
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)
        self.proj = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.weight, self.bias, stride=1, padding=1)
        y = F.batch_norm(y, self.mean, self.var, None, None, False, 0.1, 1e-3)
        y = F.elu(torch.relu(y), alpha=0.5)
        y = F.hardtanh(y, -2.0, 2.0).sigmoid()
        y = torch.clamp(F.mish(F.hardswish(y)), min=0.0)
        y = torch.tanh(F.hardsigmoid(y)).permute(0, 2, 3, 1)
        return torch.add(torch.matmul(y, self.proj), y, alpha=2)


MODULES_OPS = ["conv", "batch_norm", "relu", "mean", "linear", "gelu", "add", "layer_norm", "silu", "clamp",
               "leaky_relu", "mul"]  # fmt: skip
FUNCTIONAL_OPS = ["conv", "batch_norm", "relu", "elu", "clamp", "sigmoid", "hardswish", "mish", "clamp",
                  "hardsigmoid", "tanh", "matmul", "add"]  # fmt: skip


def recognized(graph: fx.GraphModule) -> list[tuple[str, dict]]:
    return [(c.op, c.operands) for n in graph.graph.nodes if (c := call_of(n, graph)) is not None]


def check_modules_operands(calls: list[tuple[str, dict]], graph: nn.Module) -> None:
    ops = dict(calls)
    conv, bn = ops["conv"], ops["batch_norm"]
    assert list(conv["stride"]) == [2, 2] and list(conv["padding"]) == [1, 1]
    assert constant(conv["weight"], graph).shape == (8, 3, 3, 3)
    assert constant(bn["running_var"], graph).shape == (8,) and bn["eps"] == 1e-5
    assert ops["gelu"]["approximate"] == "tanh"
    assert ops["layer_norm"]["eps"] == 1e-6
    assert (ops["clamp"]["min"], ops["clamp"]["max"]) == (0.0, 6.0)
    assert ops["leaky_relu"]["negative_slope"] == 0.2
    assert ops["mul"]["other"] == 2.0


def check_functional_operands(calls: list[tuple[str, dict]], graph: nn.Module) -> None:
    assert calls[1][1]["eps"] == 1e-3
    assert calls[3][1]["alpha"] == 0.5
    assert (calls[4][1]["min"], calls[4][1]["max"]) == (-2.0, 2.0)
    assert (calls[8][1]["min"], calls[8][1].get("max")) == (0.0, None)
    assert calls[-1][1]["alpha"] == 2
    assert constant(calls[-2][1]["other"], graph).shape == (4, 4)
    assert constant(calls[-2][1]["input"], graph) is None  # computed from the input, not fixed


def test_module_calls_are_named_with_their_attributes() -> None:
    graph = fx.symbolic_trace(Modules().eval())
    calls = recognized(graph)
    assert [op for op, _ in calls] == MODULES_OPS
    check_modules_operands(calls, graph)


def test_functions_and_methods_are_named_with_their_arguments() -> None:
    graph = fx.symbolic_trace(Functional().eval())
    calls = recognized(graph)
    assert [op for op, _ in calls] == FUNCTIONAL_OPS
    check_functional_operands(calls, graph)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize(
    ("model", "expected", "check", "shape"),
    [
        (Modules, MODULES_OPS, check_modules_operands, (2, 3, 8, 8)),
        (Functional, FUNCTIONAL_OPS, check_functional_operands, (2, 3, 5, 5)),
    ],
)
def test_aten_operators_get_the_same_names_and_operands(model, expected, check, shape) -> None:
    program = torch.export.export(model().eval(), (torch.randn(shape),), strict=False)
    graph = program.module()
    calls = recognized(graph)
    assert [op for op, _ in calls] == expected
    check(calls, graph)


class HandWrittenRMSNorm(nn.Module):
    """The pieces of a hand-written RMSNorm (Hugging Face's Llama form), and a float() conversion."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + 1e-6)).float()


RMS_OPS = ["to", "pow", "mean", "add", "rsqrt", "mul", "to", "mul"]


def check_rms_operands(calls: list[tuple[str, dict]], graph: nn.Module) -> None:
    assert calls[0][1]["dtype"] is torch.float32 and calls[6][1]["dtype"] is torch.float32
    assert calls[1][1]["exponent"] == 2
    assert list(calls[2][1]["dim"]) == [-1] if isinstance(calls[2][1]["dim"], list) else calls[2][1]["dim"] == -1
    assert calls[2][1]["keepdim"] is True
    assert calls[3][1]["other"] == 1e-6


def test_the_pieces_of_a_hand_written_rms_norm_are_named() -> None:
    graph = fx.symbolic_trace(HandWrittenRMSNorm())
    calls = recognized(graph)
    assert [op for op, _ in calls] == RMS_OPS
    check_rms_operands(calls, graph)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_pieces_of_a_hand_written_rms_norm_in_aten_form() -> None:
    graph = torch.export.export(HandWrittenRMSNorm(), (torch.randn(2, 8),), strict=False).module()
    calls = recognized(graph)
    assert [op for op, _ in calls] == RMS_OPS
    check_rms_operands(calls, graph)


@pytest.mark.skipif(not hasattr(nn, "RMSNorm"), reason="nn.RMSNorm: torch >= 2.4")
def test_rms_norm_as_a_module_and_a_function() -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(8, eps=1e-4)  # type: ignore[attr-defined]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(self.norm(x), (8,))  # type: ignore[attr-defined]

    calls = recognized(fx.symbolic_trace(Both()))
    assert [op for op, _ in calls] == ["rms_norm", "rms_norm"]
    assert calls[0][1]["eps"] == 1e-4 and calls[1][1]["eps"] is None and calls[1][1]["weight"] is None


class WrittenOutAttention(nn.Module):
    """The pieces of an attention written out: a transpose, matmul and bmm, a division, softmax in three forms."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / 4.0
        p = F.softmax(s, dim=-1, dtype=torch.float32) + self.softmax(s) + s.softmax(-1)
        return torch.bmm(p[0], k[0])


ATTENTION_OPS = ["transpose", "matmul", "div", "softmax", "softmax", "add", "softmax", "add", "matmul"]


def test_the_pieces_of_a_written_out_attention_are_named() -> None:
    calls = recognized(fx.symbolic_trace(WrittenOutAttention()))
    assert [op for op, _ in calls] == ATTENTION_OPS
    assert calls[0][1]["dim0"] == -1 and calls[0][1]["dim1"] == -2
    assert calls[2][1]["other"] == 4.0
    assert calls[3][1]["dim"] == -1 and calls[3][1]["dtype"] is torch.float32
    assert calls[4][1]["dim"] == -1 and calls[6][1]["dim"] == -1


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_pieces_of_a_written_out_attention_in_aten_form() -> None:
    graph = torch.export.export(WrittenOutAttention(), (torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)), strict=False)
    calls = recognized(graph.module())
    assert [op for op, _ in calls if op != "to"] == ATTENTION_OPS
    assert calls[-1][1]["other"] is not None  # bmm's mat2, named as matmul's other


class FilledScores(nn.Module):
    """Scores filled where a mask says so, in the function, method and (exported) ATen forms."""

    def forward(self, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.masked_fill(s, mask, -3.0) + s.masked_fill(~mask, float("-inf"))


def test_masked_fill_is_named_with_its_mask_and_value() -> None:
    graphs = [fx.symbolic_trace(FilledScores())]
    if HAS_EXPORT_AUTO:
        sample = (torch.randn(2, 3), torch.rand(2, 3) > 0.5)
        graphs.append(torch.export.export(FilledScores(), sample, strict=False).module())
    for graph in graphs:
        fills = [operands for op, operands in recognized(graph) if op == "masked_fill"]
        assert [f["value"] for f in fills] == [-3.0, float("-inf")]
        assert all(isinstance(f["input"], fx.Node) and isinstance(f["mask"], fx.Node) for f in fills)


@pytest.mark.skipif(not hasattr(F, "scaled_dot_product_attention"), reason="torch >= 2.0")
def test_scaled_dot_product_attention_as_a_function_and_in_aten_form() -> None:
    class Attend(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q = torch.randn(1, 2, 4, 8)
    graphs = [fx.symbolic_trace(Attend())]
    if HAS_EXPORT_AUTO:
        graphs.append(torch.export.export(Attend(), (q, q, q), strict=False).module())
    for graph in graphs:
        [(_, operands)] = [c for c in recognized(graph) if c[0] == "scaled_dot_product_attention"]
        assert operands["is_causal"] is True and operands.get("attn_mask") is None
        assert isinstance(operands["input"], fx.Node) and isinstance(operands["value"], fx.Node)


class RotateHalf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., 4:], x[..., :4]), dim=-1)


def test_the_pieces_of_a_rotary_embedding_are_named() -> None:
    graphs = [fx.symbolic_trace(RotateHalf())]
    if HAS_EXPORT_AUTO:
        graphs.append(torch.export.export(RotateHalf(), (torch.randn(2, 8),), strict=False).module())
    for graph in graphs:
        calls = recognized(graph)
        assert [op for op, _ in calls] == ["slice", "neg", "slice", "cat"]
        high, low = calls[0][1], calls[2][1]
        assert high["start"] == 4 and low["end"] == 4 and low["start"] in (None, 0)
        assert calls[3][1]["dim"] == -1 and len(calls[3][1]["tensors"]) == 2


def test_batch_statistics_are_not_a_batch_norm_to_fold() -> None:
    class Training(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.batch_norm(x, None, None, training=True) + self.bn(x)

    model = Training().train()
    graph = fx.symbolic_trace(model)
    assert [op for op, _ in recognized(graph)] == ["add"]  # neither normalization uses running statistics
    model.eval()
    assert [op for op, _ in recognized(graph)] == ["batch_norm", "add"]


def test_in_place_forms_say_so_and_unknown_calls_are_none() -> None:
    class InPlace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.flip(F.relu(x.add_(1.0), inplace=True), (0,))

    graph = fx.symbolic_trace(InPlace())
    calls = recognized(graph)
    assert [op for op, _ in calls] == ["add", "relu"]
    assert calls[0][1]["inplace"] is True and calls[1][1]["inplace"] is True
    flip = next(n for n in graph.graph.nodes if n.target is torch.flip)
    assert call_of(flip, graph) is None


def test_every_activation_has_a_module_form() -> None:
    modules = [nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Sigmoid(), nn.Tanh(), nn.Hardswish(), nn.Hardsigmoid(), nn.Mish(),
               nn.ELU(), nn.LeakyReLU(), nn.Hardtanh()]  # fmt: skip
    seen = set()
    for module in modules:
        graph = fx.symbolic_trace(nn.Sequential(module))
        ((op, _),) = recognized(graph)
        seen.add(op)
    assert seen == ACTIVATIONS
