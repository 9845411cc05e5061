"""Chains of data movement as one gather (ember._optimize.graph.gather_rearrangements): Swin's rolled window
partition and its reverse become one node that gathers rows, the same numbers at every batch size and for inputs
the gather does not take; a chain that copies once, a value read elsewhere inside the chain, and a movement of parts
of rows leave the graph's own operations (or the node's chain) in place."""

from __future__ import annotations

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, all_passes, assert_matches, captured, exported, graph_forward
from torch import fx, nn

import ember
from ember._optimize.graph.gather_rearrangements import gather_rearrangements
from ember._optimize.graph.rearrangement_node import FusedRearrangement


def partition(x: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """Swin's shifted window partition: [b, h, w, c] -> [b * windows, window * window, c]."""
    b, h, w, c = x.shape[0], x.shape[1], x.shape[2], x.shape[3]  # (indexed: torch 1.13's tracing iterates no shape)
    x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    x = x.view(b, h // window, window, w // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window * window, c)


def reverse(windows: torch.Tensor, window: int, shift: int, h: int, w: int) -> torch.Tensor:
    """Its inverse: [b * windows, window * window, c] -> [b, h, w, c]."""
    c = windows.shape[-1]
    x = windows.view(-1, h // window, w // window, window, window, c)
    x = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, h, w, c)
    return torch.roll(x, shifts=(shift, shift), dims=(1, 2))


class ShiftedWindows(nn.Module):
    """A Linear on each window's tokens between the partition and the reverse, as a Swin block's attention is."""

    def __init__(self, channels: int = 8, window: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.proj = nn.Linear(channels, channels)
        self.window, self.shift = window, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1], x.shape[2]
        windows = self.proj(partition(x, self.window, self.shift))
        return reverse(windows, self.window, self.shift, h, w)


def rearrangements(gm: fx.GraphModule) -> list[FusedRearrangement]:
    return [m for m in gm.modules() if isinstance(m, FusedRearrangement)]


def test_a_rolled_window_partition_and_its_reverse_are_one_gather_each() -> None:
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    x = torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        gm = all_passes(model, x)
        nodes = rearrangements(gm)
        assert len(nodes) == 2
        ops = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
        assert torch.roll not in ops and "contiguous" not in ops and "permute" not in ops
        for batch in (1, 3):  # the plan is made per shape: a new batch size gathers as well
            y = torch.randn(batch, 8, 8, 8)
            assert torch.allclose(gm(y), model(y), rtol=1e-5, atol=1e-6)
        assert all(plan is not None for node in nodes for plan in node._plans.values())
        assert sorted(len(node._plans) for node in nodes) == [2, 2]


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_with_symbolic_sizes_is_one_gather() -> None:
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        gm = exported(model, x)
        assert gather_rearrangements(gm) == 2
        for batch in (2, 5):
            y = torch.randn(batch, 8, 8, 8)
            assert torch.allclose(gm(y), model(y), rtol=1e-5, atol=1e-6)


def test_inputs_the_gather_does_not_take_run_the_chain() -> None:
    torch.manual_seed(0)
    model = ShiftedWindows(channels=6).eval()
    with torch.no_grad():
        gm = all_passes(model, torch.randn(1, 8, 8, 6))
        strided = torch.randn(1, 8, 8, 12)[..., ::2]  # not contiguous
        assert torch.allclose(gm(strided), model(strided), rtol=1e-5, atol=1e-6)
        other_size = torch.randn(2, 12, 8, 6)  # another image size: a plan of its own
        assert torch.allclose(gm(other_size), model(other_size), rtol=1e-5, atol=1e-6)
        with pytest.raises(RuntimeError):  # a size the windows do not divide fails as the model's own view does
            gm(torch.randn(1, 10, 8, 6))


class CopiesOnce(nn.Module):
    """A window partition without the roll: one permuted copy, which a gather would not save."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
        x = x.view(b, h // 4, 4, w // 4, 4, c)
        return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 16, c)


class ReadInside(nn.Module):
    """The rolled tensor is read twice: the chain ends at the roll (two copies alone, one gather), and what follows
    it copies once."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rolled = torch.roll(x, shifts=(1, 1), dims=(1, 2))
        windows = rolled.view(1, 2, 4, 2, 4, 8).permute(0, 1, 3, 2, 4, 5).contiguous()
        return windows.view(-1, 16, 8), rolled.sum(dim=-1)


def test_a_chain_ends_where_its_value_is_read_elsewhere_and_one_copy_is_left_alone() -> None:
    x = torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        assert gather_rearrangements(captured(CopiesOnce(), x)) == 0
        gm = captured(ReadInside(), x)
        assert gather_rearrangements(gm) == 1
        (node,) = rearrangements(gm)
        assert [n.target for n in node.original.graph.nodes if n.op == "call_function"] == [torch.roll]
        assert "contiguous" in [n.target for n in gm.graph.nodes]
        assert [torch.allclose(a, b) for a, b in zip(gm(x), ReadInside()(x))] == [True, True]


class MovesParts(nn.Module):
    """A roll along the last dimension: elements move within rows, which no gather of whole rows gives."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x, shifts=1, dims=-1).transpose(0, 1).contiguous()


def test_a_chain_that_moves_parts_of_rows_runs_itself() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5)
    with torch.no_grad():
        gm = captured(MovesParts(), x)
        assert gather_rearrangements(gm) == 1
        assert torch.equal(gm(x), MovesParts()(x))
        (node,) = rearrangements(gm)
        assert list(node._plans.values()) == [None]


def test_the_chain_runs_under_autograd() -> None:
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    with torch.no_grad():
        gm = all_passes(model, torch.randn(1, 8, 8, 8))
    x = torch.randn(1, 8, 8, 8, requires_grad=True)
    gm(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gather_keeps_the_dtype(dtype: torch.dtype) -> None:
    x = torch.randn(2, 8, 8, 4).to(dtype)

    class Partition(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return partition(x, 4, 2)

    with torch.no_grad():
        traced = captured(Partition(), x)
        assert gather_rearrangements(traced) == 1
        got = traced(x)
        assert got.dtype == dtype and torch.equal(got, partition(x, 4, 2))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_hugging_face_swins_shifted_windows_gather() -> None:
    """A Hugging Face Swin stage of two blocks, the second shifted: its rolled partition and reverse are one gather
    each, and the model's outputs are the same at the batch captured and another."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = t.SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=[2], num_heads=[1], window_size=4)
    model = t.SwinModel(config).eval()
    sample = {"pixel_values": torch.randn(1, 3, 16, 16)}
    optimized = ember.optimize(model, graph_mode=True, sample_input=sample)
    forward = graph_forward(optimized)
    assert forward.path == "torch.export"
    assert len(rearrangements(forward.graph)) == 2
    assert_matches(optimized, model, sample, 1e-5, 1e-5)
    assert_matches(optimized, model, {"pixel_values": torch.randn(3, 3, 16, 16)}, 1e-5, 1e-5)
