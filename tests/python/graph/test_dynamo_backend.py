"""``torch.compile(model, backend="ember")``: found by name through the entry point, the same passes on dynamo's
graphs (parameters passed as inputs), torch's results, and training graphs left as they are."""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from graphs import close
from torch import nn

from ember import _C
from ember._optimize.graph.dynamo import ember_backend
from ember._optimize.graph.nodes import FusedLayer

dynamo = pytest.importorskip("torch._dynamo")
COMPILES = hasattr(torch, "compile") and torch.__version__ >= "2.1"
pytestmark = pytest.mark.skipif(not COMPILES, reason="this torch has no torch.compile with entry-point backends")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.conv(x))).mean((2, 3))
        y = F.gelu(self.fc(y)) + y
        return self.head(F.dropout(y, 0.1, self.training))


class Recording:
    """ember's backend, remembering the graphs it returned."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        compiled = ember_backend(gm, example_inputs)
        self.graphs.append(gm)
        return compiled

    def fused_layers(self) -> list[FusedLayer]:
        return [m for gm in self.graphs for m in gm.modules() if isinstance(m, FusedLayer)]


def _compiled_recording() -> tuple[Block, Recording, Callable[..., torch.Tensor]]:
    """A Block in eval mode, ember's backend remembering its graphs, and the Block compiled with it."""
    torch.manual_seed(0)
    model = Block().eval()
    backend = Recording()
    dynamo.reset()
    return model, backend, torch.compile(model, backend=backend)


def test_the_backend_is_registered_by_name() -> None:
    entry_points = importlib.metadata.entry_points()
    group = (
        entry_points.select(group="torch_dynamo_backends")
        if hasattr(entry_points, "select")
        else entry_points.get("torch_dynamo_backends", [])
    )
    assert [e.value for e in group if e.name == "ember"] == ["ember._optimize.graph.dynamo:ember_backend"]
    assert "ember" in dynamo.list_backends(exclude_tags=())


def test_compile_by_name_computes_what_the_model_does() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        for shape in ((2, 3, 8, 8), (5, 3, 6, 7)):
            x = torch.randn(*shape)
            assert close(compiled(x), model(x))


def test_the_passes_run_on_dynamos_graph() -> None:
    model, backend, compiled = _compiled_recording()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert close(compiled(x), model(x))
        assert backend.graphs
        layers = backend.fused_layers()
        if _C.Linear.supported("float32"):
            assert [layer.entries for layer in layers] == [("relu",), ("gelu", "add"), ()]
            assert layers[0].state.bn is not None
        # Parameters are the graph's inputs: a changed one is what the next call uses.
        model.head.weight.mul_(2)
        assert close(compiled(x), model(x))


def test_a_training_graph_runs_as_torch_with_a_warning() -> None:
    torch.manual_seed(0)
    model = Block().train()
    dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(4, 3, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(x).sum().backward()
    assert model.conv.weight.grad is not None
    assert any("inference graphs only" in str(w.message) for w in caught) or _already_warned()


def _already_warned() -> bool:
    from ember._optimize.graph import dynamo as backend_module

    return backend_module._warned_training


def test_under_bf16_autocast_the_layers_compute_in_bf16() -> None:
    model, backend, compiled = _compiled_recording()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x)
        expected = model(x)
    assert got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), rtol=0.05, atol=0.05)
    layers = backend.fused_layers()
    if _C.Linear.supported("bfloat16") and _C.Convolution.supported("bfloat16"):
        assert layers and all(layer.state.compute == torch.bfloat16 for layer in layers)


def test_a_new_batch_size_shares_the_first_graphs_packed_weights() -> None:
    """A second batch size re-traces the model (dynamo's recompile): the new graph's layers read the kernels, and
    so the packed weights, the first graph's built, rather than packing a second copy of the model."""
    model, backend, compiled = _compiled_recording()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # (fp32 weights: packed bf16 copies)
        for batch in (2, 5):
            x = torch.randn(batch, 3, 8, 8)
            got = compiled(x)
            assert torch.allclose(got.float(), model(x).float(), rtol=0.05, atol=0.05)
    assert len(backend.graphs) == 2
    first, second = ([m for m in gm.modules() if isinstance(m, FusedLayer)] for gm in backend.graphs)
    assert first and len(first) == len(second)
    kernels = [layer.state.cache.kernel for layer in first]
    assert all(k is not None for k in kernels)
    assert [layer.state.cache.kernel for layer in second] == kernels  # the very same objects


def test_options_are_refused() -> None:
    with pytest.raises(ValueError, match="takes no options"):
        ember_backend(torch.fx.symbolic_trace(nn.Linear(2, 2)), [torch.ones(1, 2)], {"dtype": torch.bfloat16})


class TransposedWeight(nn.Module):
    """A Linear written over a weight held [in, out] and a scale: ``x @ (w.t() * scale).t()``."""

    def __init__(self) -> None:
        super().__init__()
        self.wt = nn.Parameter(torch.randn(8, 6) / 3)
        self.scale = nn.Parameter(torch.rand(6, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.linear(x, self.wt.t() * self.scale))


def test_a_weight_transform_in_dynamos_graph_is_kept_and_its_layer_lowered() -> None:
    from ember._optimize.graph.folded_node import FoldedConstant

    torch.manual_seed(0)
    model = TransposedWeight().eval()
    backend = Recording()
    dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert close(compiled(x), model(x))
        folded = [m for gm in backend.graphs for m in gm.modules() if isinstance(m, FoldedConstant)]
        assert len(folded) == 1
        if _C.Linear.supported("float32"):
            assert [layer.entries for layer in backend.fused_layers()] == [("relu",)]
        model.scale.mul_(2)  # passed anew on every call: the kept value follows it
        assert close(compiled(x), model(x))


class LayerScaled(nn.Module):
    """ConvNeXt's block end: Linear, permute back, ``layer_scale * x`` and the input added."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.layer_scale = nn.Parameter(torch.rand(8, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_scale * self.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) + x


def test_a_layer_scale_in_dynamos_graph_is_folded_and_read_as_an_input() -> None:
    torch.manual_seed(0)
    model = LayerScaled().eval()
    backend = Recording()
    dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        assert close(compiled(x), model(x))
        layers = backend.fused_layers()
        if _C.Linear.supported("float32"):
            assert [layer.state.scale is not None for layer in layers] == [True]
            assert layers[0].entries == ("add",) and layers[0].operand_permuted == (0, 2, 3, 1)
        model.layer_scale.mul_(2)  # the scale is the graph's input: a changed one is what the next call uses
        assert close(compiled(x), model(x))
