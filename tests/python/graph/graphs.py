"""Helpers of the graph-mode pass tests: a model captured as the passes get it, and what the passes left."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

from ember import _C
from ember._graph.capture import _Attempts, capture
from ember._optimize.autocast_forward import AutocastForward
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.forward import GraphForward
from ember._optimize.graph.lower import lower_layers
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands

HAS_EXPORT_AUTO = hasattr(getattr(torch, "export", None), "Dim") and hasattr(torch.export.Dim, "AUTO")


def captured(model: nn.Module, sample: Any = None) -> fx.GraphModule:
    result = capture(model.eval(), sample)
    assert result.graph is not None, result.describe()
    return result.graph


def exported(model: nn.Module, sample: Any) -> fx.GraphModule:
    """The model's graph as torch.export gives it (ATen operators), even where symbolic tracing would take it."""
    gm = _Attempts(model.eval(), sample).export()
    assert gm is not None
    return gm


def all_passes(
    model: nn.Module,
    sample: Any = None,
    compute: torch.dtype = torch.float32,
    export: bool = False,
    replay: bool = False,
) -> fx.GraphModule:
    """The model's graph (symbolic trace, or torch.export) after every pass graph mode runs, in its order; the fused
    nodes left in the graph itself unless ``replay`` (replay_segments then moves runs of them into segments)."""
    gm = exported(model, sample) if export else captured(model, sample)
    run_passes(gm, TensorOperands(model, gm), compute, replay)
    return gm


def lowered(model: nn.Module, gm: fx.GraphModule) -> list[str]:
    """The lowering pass alone on ``gm`` (a graph of ``model``), in fp32."""
    return lower_layers(gm, TensorOperands(model, gm), torch.float32)


def fused_layers(gm: fx.GraphModule) -> list[FusedLayer]:
    """The fused nodes' modules, in graph order."""
    return [
        m
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(m := gm.get_submodule(str(n.target)), FusedLayer)
    ]


def fused_norms(gm: fx.GraphModule) -> list[FusedNorm]:
    """The fused norm nodes' modules, in graph order."""
    return [
        m
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(m := gm.get_submodule(str(n.target)), FusedNorm)
    ]


def fused_attention(gm: fx.GraphModule) -> list[FusedAttention]:
    """The fused attention nodes' modules, in graph order."""
    return [
        m
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(m := gm.get_submodule(str(n.target)), FusedAttention)
    ]


def small_llama(transformers: Any) -> tuple[nn.Module, torch.Tensor]:
    """A 2-layer Llama-shaped causal LM with grouped key/value heads (4 over 2), random weights (seed 0), in eval
    mode, and a batch of 2 sequences of 7 token ids for it."""
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, torch.randint(0, 100, (2, 7))


class LinearThen(nn.Module):
    """A Linear (16 -> 24) and then ``activation``, a function of its output: an activation pass's test model."""

    def __init__(self, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 24)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.fc(x))


def close(got: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5) -> bool:
    return got.shape == expected.shape and got.dtype == expected.dtype and torch.allclose(got, expected, rtol, atol)


def within_autocast_error(got: torch.Tensor, exact: torch.Tensor, autocast: torch.Tensor) -> bool:
    """bf16 held to autocast's own error: ``got``'s distance from the fp32 result is at most three times eager
    autocast's (plus a hair of the result's scale), so a wrong rewrite, which errs by O(1), cannot pass, while one
    bf16 rounding more or less than eager's can."""
    got, exact, autocast = got.float(), exact.float(), autocast.float()
    scale = float(exact.abs().max()) or 1.0
    autocast_error = float((autocast - exact).abs().max())
    return float((got - exact).abs().max()) <= 3 * autocast_error + 1e-3 * scale


def graph_forward(model: nn.Module) -> GraphForward:
    forward = model.__dict__["forward"]
    if isinstance(forward, AutocastForward):
        forward = forward.inner
    assert isinstance(forward, GraphForward), forward
    return forward


def outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in outputs(v)] if isinstance(value, (tuple, list)) else []


def assert_matches(optimized: nn.Module, model: nn.Module, args: Any, rtol: float, atol: float) -> None:
    args = args if isinstance(args, dict) else {"x": args}
    with torch.no_grad():
        got = outputs(optimized(*args.values()) if "x" in args else optimized(**args))
        expected = outputs(model(*args.values()) if "x" in args else model(**args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.float(), e.float(), rtol=rtol, atol=atol)


def count_calls(monkeypatch: pytest.MonkeyPatch, node_module: Any, kernel: str) -> list[int]:
    """Counts the calls ``node_module`` makes to ``_C.<kernel>`` (each then runs): ``[count]``."""
    calls = [0]
    real = getattr(_C, kernel)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(node_module, "_C", types.SimpleNamespace(**{kernel: counted}))
    return calls
