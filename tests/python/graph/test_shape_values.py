"""The shape-values pass (ember._optimize.graph.shape_values): tensors computed from the inputs' sizes alone (masks
from positions, a window mask filled in place) are computed once per input signature and kept; not a value that
reads an input's numbers, one the graph returns, one something else writes in place, or one read before a write
into it; and a kept value follows the input's size, dtype and the model's tensors it reads."""

from __future__ import annotations

import copy

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, exported
from torch import fx, nn

from ember._optimize.graph.shape_values import cache_shape_values
from ember._optimize.graph.shape_values_node import ShapeValues

needs_export = pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")


def _kept(gm: fx.GraphModule) -> list[ShapeValues]:
    return [m for m in gm.modules() if isinstance(m, ShapeValues)]


def _count(gm: fx.GraphModule, name: str) -> int:
    return sum(1 for n in gm.graph.nodes if name in str(n.target))


class PositionMask(nn.Module):
    """An encoder's mask from positions, and a window mask filled in place, added to the scores: as Hugging Face's
    and Swin's masks are built."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        keep = (torch.arange(n) >= 1)[None, :].expand(x.shape[0], n)
        window = x.new_zeros((x.shape[0], n))
        window[:, : n // 2] = 1.0
        window[:, n // 2 :] = 2.0
        return torch.where(keep, x, -1.0) + window * self.bias


@needs_export
def test_a_mask_from_sizes_is_kept_per_signature() -> None:
    model = PositionMask().eval()
    gm = exported(model, torch.randn(4, 8))
    assert cache_shape_values(gm) >= 1
    assert _count(gm, "fill_") == 0 and _count(gm, "arange") == 0  # computed inside the kept values now
    [*kept] = _kept(gm)
    assert kept
    with torch.no_grad():
        for batch in (4, 4, 6, 4):
            x = torch.randn(batch, 8)
            assert torch.equal(gm(x), model(x))
    assert all(len(m.kept) == 2 for m in kept)  # batches 4 and 6


@needs_export
def test_a_kept_value_follows_the_models_tensors() -> None:
    model = PositionMask().eval()
    gm = exported(model, torch.randn(4, 8))
    cache_shape_values(gm)
    x = torch.randn(4, 8)
    with torch.no_grad():
        gm(x)
        model.bias.mul_(3)  # in place: the version counter moves
        assert torch.equal(gm(x), model(x))


@needs_export
def test_a_kept_value_follows_autocast() -> None:
    model = PositionMask().eval()
    gm = exported(model, torch.randn(4, 8))
    cache_shape_values(gm)
    x = torch.randn(4, 8)
    with torch.no_grad():
        plain = gm(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = gm(x)
            expected = model(x)
    assert torch.equal(plain, model(x)) and under.dtype == expected.dtype and torch.equal(under, expected)


def _assert_matches_twice(model: nn.Module) -> None:
    """The graph, after the pass, computes the model's result on two calls of fresh inputs."""
    gm = exported(model, torch.randn(4, 4))
    cache_shape_values(gm)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 4)
            assert torch.equal(gm(x), model(x))


class ReadsNumbers(nn.Module):
    """A mask from the input's values: not a shape value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x > 0).float().cumsum(-1)


@needs_export
def test_a_value_read_from_the_inputs_numbers_is_not_kept() -> None:
    gm = exported(ReadsNumbers().eval(), torch.randn(4, 8))
    assert cache_shape_values(gm) == 0


class Returned(nn.Module):
    """A mask the model returns: its caller may write it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.ones(x.shape[0], x.shape[1]).tril()
        return x * mask, mask


@needs_export
def test_a_value_the_graph_returns_is_not_kept_for_the_caller() -> None:
    model = Returned().eval()
    gm = exported(model, torch.randn(4, 4))
    cache_shape_values(gm)
    with torch.no_grad():
        first = gm(torch.randn(4, 4))[1]
        first.fill_(7)  # the caller writes what it was given
        again = gm(torch.randn(4, 4))[1]
    assert torch.equal(again, torch.ones(4, 4).tril())


class WrittenAfterwards(nn.Module):
    """A mask another operation writes in place after reading from the input: the pass keeps nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], x.shape[1])
        mask.add_(x)
        return mask * 2


@needs_export
def test_a_value_something_else_writes_is_not_kept() -> None:
    model = WrittenAfterwards().eval()
    _assert_matches_twice(model)


class ReadThenWritten(nn.Module):
    """A mask read, then filled in place, then read again: each read sees the value of its moment."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], x.shape[1])
        before = x + mask
        mask.fill_(2.0)
        return before * mask


@needs_export
def test_a_value_read_before_a_write_into_it_is_not_kept_written() -> None:
    model = ReadThenWritten().eval()
    _assert_matches_twice(model)


class ExpandedToken(nn.Module):
    """A parameter viewed to the batch's size (ViT's class token): nothing computed, nothing kept."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


@needs_export
def test_a_view_of_a_models_tensor_is_not_kept() -> None:
    gm = exported(ExpandedToken().eval(), torch.randn(2, 3, 8))
    assert cache_shape_values(gm) == 0


@needs_export
def test_a_copy_keeps_no_values_of_the_original() -> None:
    model = PositionMask().eval()
    gm = exported(model, torch.randn(4, 8))
    cache_shape_values(gm)
    with torch.no_grad():
        gm(torch.randn(4, 8))
    for kept in _kept(gm):
        assert kept.kept
        copied = copy.deepcopy(kept)
        assert not copied.kept and copied.expression is not kept.expression
