"""The dead-code pass (ember._optimize.graph.remove_dead_code): pure operations nothing reads leave the graph, chains
of them included; an in-place operation whose result is unread stays (its effect is read), and so does anything
the pass does not know to be pure."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, captured, close
from torch import nn

from ember._optimize.graph.remove_dead_code import remove_dead_code


class Discards(nn.Module):
    """Computes a chain nobody reads (a scaled softmax of the layer's output, a reshape of it) beside its result."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        unused = torch.softmax(y * 0.5, dim=-1).reshape(-1)  # noqa: F841 - the point of the test
        _ = y.size(0)
        return torch.relu(y)


def test_unread_pure_chains_are_removed() -> None:
    torch.manual_seed(0)
    model = Discards().eval()
    x = torch.randn(3, 8)
    gm = captured(model, x)
    before = len(gm.graph.nodes)
    assert remove_dead_code(gm) >= 3  # the reshape, the softmax, the scale (and the size read)
    assert len(gm.graph.nodes) < before
    assert not any("softmax" in str(n.target) for n in gm.graph.nodes)
    with torch.no_grad():
        assert close(gm(x), model(x))


class InPlace(nn.Module):
    """``x.relu_()``'s returned value is unread, but it changes x, which is read."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        F.relu(y, inplace=True)
        return y + 1


def test_an_in_place_operation_stays() -> None:
    gm = captured(InPlace(), torch.randn(4))
    assert remove_dead_code(gm) == 0
    x = torch.randn(6)
    assert close(gm(x.clone()), InPlace()(x.clone()))


def test_what_is_not_known_pure_stays() -> None:
    gm = captured(InPlace(), torch.randn(4))
    with gm.graph.inserting_before(list(gm.graph.nodes)[-1]):
        gm.graph.call_function(print, ("side effect",))
        gm.graph.call_function(operator.getitem, (next(iter(gm.graph.nodes)), 0))
    gm.recompile()
    assert remove_dead_code(gm) == 1  # the getitem; print stays
    assert any(n.target is print for n in gm.graph.nodes)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_after_every_pass() -> None:
    torch.manual_seed(0)
    model = Discards().eval()
    x = torch.randn(2, 3, 8)
    gm = all_passes(model, x, export=True)
    assert not any("softmax" in str(n.target) for n in gm.graph.nodes)
    with torch.no_grad():
        assert close(gm(x), model(x))
