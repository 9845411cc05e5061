"""The last pass (ember._optimize.graph.views_as_methods): torch.export's view overloads become the tensor methods
they are; the graph computes the same, and what is no such view stays as it was."""

from __future__ import annotations

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, captured, close, exported
from torch import nn

from ember._optimize.graph.views_as_methods import METHODS, views_as_methods


class Heads(nn.Module):
    """A multi-head split and merge in every view the pass knows, and a softmax (no view) between them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.size(0), x.size(1)
        h = x.view(b, s, 2, 4).transpose(1, 2).unsqueeze(0).squeeze(0)
        h = torch.softmax(h.permute(0, 1, 3, 2), dim=-1).select(1, 0)
        return h.reshape(b, -1) + x[:, 0].t().t().reshape(b, -1).sum()


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_export_views_become_methods() -> None:
    model = Heads().eval()
    x = torch.randn(3, 5, 8)
    gm = exported(model, (x,))
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in METHODS]
    assert len(views) >= 6
    assert views_as_methods(gm) == len(views)
    assert not any(n.op == "call_function" and n.target in METHODS for n in gm.graph.nodes)
    assert any(n.op == "call_function" and "softmax" in str(n.target) for n in gm.graph.nodes)  # not a view: stays
    for other in (x, torch.randn(2, 7, 8)):
        assert close(gm(other), model(other))


def test_a_traced_graph_has_methods_already() -> None:
    model = Heads().eval()
    x = torch.randn(3, 5, 8)
    gm = captured(model, (x,))
    code = gm.code
    assert views_as_methods(gm) == 0
    assert gm.code == code
