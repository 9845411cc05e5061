"""The merge pass (ember._optimize.graph.merge_linears): Linears that read one input run as one GEMM where each would
pack a copy of its weight anyway (an fp32 model computing in bf16); Linears with something fused into them, reading
other inputs, or reading their weights in place (fp32 computing in fp32) stay apart. Results are compared with the
model's own under bf16 autocast, and with autograd the parts' weights get their gradients."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes, fused_layers, graph_forward, small_llama
from torch import nn

import ember
from ember._optimize.graph import passes
from ember._optimize.graph.merge_linears import merge_linears
from ember._optimize.graph.nodes import FusedLayer, FusedMergedLinear

needs_bf16 = pytest.mark.skipif(
    not ember._C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX"
)
D = 32


class Projections(nn.Module):
    """A transformer block's entry: Q, K and V of one input (K and V narrower, as grouped-query heads make them),
    one with no bias, and a Linear of another input beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D // 2, bias=False)
        self.v = nn.Linear(D, D // 2)
        self.other = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return self.q(x), self.k(x), self.v(x), self.other(y)


class GatedMLP(nn.Module):
    """Llama's MLP: the gate's SiLU is fused into its Linear, so it and the up projection stay apart."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, 2 * D, bias=False)
        self.up = nn.Linear(D, 2 * D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.up(x)


def _merged(gm: torch.fx.GraphModule) -> list[FusedMergedLinear]:
    return [m for m in fused_layers(gm) if isinstance(m, FusedMergedLinear)]


@needs_bf16
def test_projections_of_one_input_run_as_one_gemm() -> None:
    torch.manual_seed(0)
    model = Projections().eval()
    x, y = torch.randn(2, 5, D), torch.randn(2, 5, D)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        gm = all_passes(model, (x, y), compute=torch.bfloat16)
        got, expected = gm(x, y), model(x, y)
    [merged] = _merged(gm)
    assert len(merged.state.parts) == 3
    assert len(fused_layers(gm)) == 2  # the merged one and `other`
    # and the parts' own nodes are gone from the GraphModule (each forward would check their weights)
    assert sum(isinstance(m, FusedLayer) for m in gm.modules()) == 2
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert torch.allclose(g.float(), e.float(), rtol=2e-2, atol=2e-2)


@needs_bf16
def test_a_layer_with_an_epilogue_stays_apart() -> None:
    torch.manual_seed(0)
    model = GatedMLP().eval()
    x = torch.randn(3, D)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        gm = all_passes(model, (x,), compute=torch.bfloat16)
        assert torch.allclose(gm(x).float(), model(x).float(), rtol=2e-2, atol=2e-2)
    assert not _merged(gm)


def test_weights_read_in_place_are_not_merged() -> None:
    """fp32 computing in fp32 reads each weight where it is: a merged copy would add memory."""
    model = Projections().eval()
    x, y = torch.randn(2, 5, D), torch.randn(2, 5, D)
    with torch.no_grad():
        gm = all_passes(model, (x, y))
        for g, e in zip(gm(x, y), model(x, y)):
            assert torch.allclose(g, e, rtol=1e-5, atol=1e-5)
    assert not _merged(gm)


@needs_bf16
def test_autograd_reaches_every_parts_weights() -> None:
    torch.manual_seed(0)
    model = Projections().eval()
    x, y = torch.randn(2, 5, D), torch.randn(2, 5, D)
    gm = all_passes(model, (x, y), compute=torch.bfloat16)
    assert _merged(gm)
    sum(t.sum() for t in gm(x, y)).backward()
    grads = [p.grad.clone() for p in (model.q.weight, model.k.weight, model.v.weight, model.v.bias)]
    model.zero_grad()
    sum(t.sum() for t in model(x, y)).backward()
    for got, expected in zip(grads, (model.q.weight.grad, model.k.weight.grad, model.v.weight.grad, model.v.bias.grad)):
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_a_changed_weight_is_seen() -> None:
    """The merged layer's packed copy is rebuilt when a part's weight changes in place."""
    torch.manual_seed(0)
    model = Projections().eval()
    x, y = torch.randn(2, 5, D), torch.randn(2, 5, D)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        gm = all_passes(model, (x, y), compute=torch.bfloat16)
        gm(x, y)
        model.k.weight.mul_(-3)
        got, expected = gm(x, y)[1], model(x, y)[1]
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=5e-2)


@needs_bf16
def test_graph_mode_merges_llama_projections() -> None:
    transformers = pytest.importorskip("transformers")
    model, ids = small_llama(transformers)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(ids).logits
    if not hasattr(getattr(torch, "export", None), "Dim") or not hasattr(torch.export.Dim, "AUTO"):
        pytest.skip("Hugging Face models are captured by torch.export with automatic dynamic sizes")
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=(ids,))
    graph = graph_forward(optimized).graph
    assert sum(isinstance(m, FusedMergedLinear) for m in graph.modules()) == 2  # Q, K and V of each layer
    with torch.no_grad():
        got = optimized(ids).logits
    assert torch.allclose(got.float(), expected.float(), atol=3e-2, rtol=3e-2)


@needs_bf16
@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile: torch >= 2.0")
def test_the_dynamo_backend_merges_with_weights_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    merged = []

    def counting(gm: Any, operands: Any) -> int:
        merged.append(merge_linears(gm, operands))
        return merged[-1]

    monkeypatch.setattr(passes, "merge_linears", counting)
    torch.manual_seed(0)
    model = Projections().eval()
    x, y = torch.randn(2, 5, D), torch.randn(2, 5, D)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = compiled(x, y), model(x, y)
    for g, e in zip(got, expected):
        assert torch.allclose(g.float(), e.float(), rtol=2e-2, atol=2e-2)
    assert merged == [2]  # K and V merged into the GEMM of Q
    torch._dynamo.reset()
