"""The identity pass (ember._optimize.graph.remove_identities): eval-mode dropout of every spelling and nn.Identity
leave the graph; a dropout that trains (``training=True`` written into the call) stays; a pad by nothing leaves a graph
that writes nothing in place."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, captured, close, exported
from torch import fx, nn

from ember._optimize.graph.remove_identities import remove_identities


class Dropouts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.drop2d = nn.Dropout2d(0.2)
        self.same = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(x) + 1
        x = self.drop2d(x) * 2
        x = F.dropout(x, 0.5, training=self.training) - 1
        return self.same(x)


def _count(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_module", "call_function", "call_method") for n in gm.graph.nodes)


def test_eval_mode_dropouts_and_identities_are_removed() -> None:
    model = Dropouts().eval()
    x = torch.randn(2, 3, 4, 4)
    gm = captured(model)
    before = _count(gm)
    assert remove_identities(gm) == 4
    assert _count(gm) == before - 4
    assert close(gm(x), model(x))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_aten_dropouts_are_removed() -> None:
    model = Dropouts().eval()
    x = torch.randn(2, 3, 4, 4)
    gm = exported(model, x)
    assert remove_identities(gm) >= 3  # the Identity module leaves no operator in an exported graph
    assert close(gm(x), model(x))


class AlwaysDrops(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, training=True)


def test_a_dropout_that_trains_stays() -> None:
    gm = captured(AlwaysDrops().eval())
    assert remove_identities(gm) == 0
    torch.manual_seed(0)
    out = gm(torch.ones(1000))
    assert (out == 0).any() and (out == 2).any()


class DropsNothing(nn.Module):
    """torchvision 0.14's Swin: ``F.dropout(attn, p=0.0)`` with the default ``training=True``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x * 2, p=0.0) + 1


def test_a_dropout_of_probability_zero_is_removed_even_where_it_trains() -> None:
    model = DropsNothing().eval()
    gm = captured(model)
    assert remove_identities(gm) == 1
    assert not [n for n in gm.graph.nodes if "dropout" in str(n.target)]
    x = torch.randn(3, 5)
    assert close(gm(x), model(x))


class Padded(nn.Module):
    """Swin's window padding: by nothing where the size divides (a copy in torch), by something where it does not;
    ``in_place`` adds to the padded value in place, where the copy is then what keeps x unchanged."""

    def __init__(self, in_place: bool = False) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        same = F.pad(x, (0, 0, 0, 0))
        if self.in_place:
            same.add_(1.0)
        return same * 2 + x, F.pad(x, (0, 1, 0, 0))


def _pads(gm: fx.GraphModule) -> int:
    """The graph's pads (a pad by nothing the pass rewrote counts as none)."""
    return sum(n.target is F.pad or "aten.pad" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def test_a_pad_by_nothing_is_removed() -> None:
    model = Padded().eval()
    x = torch.randn(2, 3, 4)
    gm = captured(model)
    assert _pads(gm) == 2
    assert remove_identities(gm) == 1
    assert _pads(gm) == 1  # the pad that pads stays
    for got, expected in zip(gm(x), model(x)):
        assert close(got, expected)


def test_a_pad_by_nothing_stays_where_the_graph_writes_in_place() -> None:
    model = Padded(in_place=True).eval()
    x = torch.randn(2, 3, 4)
    gm = captured(model)
    assert remove_identities(gm) == 0 and _pads(gm) == 2
    before = x.clone()
    for got, expected in zip(gm(x), model(before.clone())):
        assert close(got, expected)
    assert torch.equal(x, before)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_a_pad_by_nothing_in_aten_form_is_removed() -> None:
    model = Padded().eval()
    x = torch.randn(2, 3, 4)
    gm = exported(model, (x,))
    assert _pads(gm) == 2
    assert remove_identities(gm) >= 1
    assert _pads(gm) == 1
    for got, expected in zip(gm(x), model(x)):
        assert close(got, expected)


class PaddedStrided(nn.Module):
    """A pad by nothing of a strided x, read as rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x.transpose(1, 2), (0, 0, 0, 0)).reshape(x.shape[0], -1) * 2


def test_a_pad_by_nothing_keeps_its_inputs_strides_so_the_input_stands_for_it() -> None:
    x = torch.randn(2, 3, 4)
    strided = x.transpose(1, 2)
    assert F.pad(strided, (0, 0, 0, 0)).stride() == strided.stride()  # torch's copy has x's strides
    model = PaddedStrided().eval()
    gm = captured(model, x)
    assert remove_identities(gm) == 1 and _pads(gm) == 0
    assert close(gm(x), model(x))
