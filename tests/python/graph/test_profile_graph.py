"""benchmarks/profile_graph.py, the diagnosis of where a graph-mode forward's time goes: it records the fused
calls the forward makes, replays them, and leaves the model as it found it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "profile_graph.py"


@pytest.fixture(scope="module")
def profile_graph():
    spec = importlib.util.spec_from_file_location("ember_bench_profile_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.down(F.gelu(self.up(x))) + x)
        return self.norm(self.down(F.gelu(self.up(y))) + y)  # the same nodes' modules called twice


def test_the_profile_counts_every_fused_call_and_restores_the_model(profile_graph) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    optimized = ember.optimize(Block().eval(), graph_mode=True, sample_input=x)
    graph = profile_graph.graph_of(optimized).graph
    fused = [m for _, m in graph.named_children() if type(m).__name__.startswith("Fused")]
    calls = []
    hooks = [m.register_forward_hook(lambda m, a, out: calls.append(m)) for m in fused]
    with torch.no_grad():
        expected = optimized(x)
    for hook in hooks:
        hook.remove()

    versions = [t._version for t in (*optimized.parameters(), *optimized.buffers())]
    result = profile_graph.profile(optimized, lambda: optimized(x), samples=3)

    assert result.calls == len(calls) > 0
    assert sum(count for count, _, _ in result.hot.values()) == len(calls)
    assert set(result.hot) == set(result.in_order)
    assert sum(count for count, *_ in result.in_order.values()) == len(calls)
    assert any(kind.startswith("FusedNorm") for kind in result.hot)
    assert min(result.forward_us, result.replay_us, result.skeleton_us) > 0
    assert "replay of the fused calls" in result.report()
    assert all("forward" not in m.__dict__ for m in fused)  # each node's own forward again
    # the "fresh" column rewrote the calls' inputs, never the model's tensors
    assert [t._version for t in (*optimized.parameters(), *optimized.buffers())] == versions
    with torch.no_grad():
        assert torch.equal(optimized(x), expected)


def test_a_model_without_a_graph_is_refused(profile_graph) -> None:
    optimized = ember.optimize(nn.Sequential(nn.Linear(4, 4)).eval(), graph_mode=False)
    with pytest.raises(ValueError, match="no graph-mode forward"):
        profile_graph.profile(optimized, lambda: optimized(torch.randn(1, 4)))
