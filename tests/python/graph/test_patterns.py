"""What the passes ask of a node (ember._graph.patterns): ``scalar_constant``, the number a graph computes on every
call from constants torch.export lifted out of the forward, and never from a parameter or buffer (which the user
may change after the graph is built); ``permutation``, the dimensions of a permute in each of its spellings."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from ember._graph.patterns import permutation, scalar_constant

HAS_EXPORT_AUTO = hasattr(getattr(torch, "export", None), "Dim") and hasattr(torch.export.Dim, "AUTO")
needs_export = pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")


class DividedBy(nn.Module):
    """``x / c`` for a divisor spelled as ``source`` says: computed from a size as DeBERTa does, a parameter, a
    buffer, or the input's own values."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source
        self.temperature = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("scale", torch.tensor(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.source == "size":
            divisor = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 2).to(dtype=x.dtype)
        elif self.source == "parameter":
            divisor = self.temperature * 1
        elif self.source == "buffer":
            divisor = self.scale.sqrt()
        else:
            divisor = x.amax()
        return x / divisor


def _divisor(source: str) -> tuple[fx.Node, fx.GraphModule]:
    model = DividedBy(source).eval()
    gm = torch.export.export(model, (torch.randn(3, 8),), strict=False).module()
    [div] = [n for n in gm.graph.nodes if str(n.target) == "aten.div.Tensor"]
    return div.args[1], gm


@needs_export
def test_a_divisor_computed_from_a_static_size_is_its_number() -> None:
    divisor, gm = _divisor("size")
    assert scalar_constant(divisor, gm) == pytest.approx(4.0)  # sqrt(8 * 2)


@needs_export
@pytest.mark.parametrize("source", ["parameter", "buffer", "input"])
def test_a_model_tensor_or_an_input_is_never_a_number(source: str) -> None:
    divisor, gm = _divisor(source)
    assert scalar_constant(divisor, gm) is None


def test_what_is_no_node_or_reads_a_placeholder_is_none() -> None:
    gm = fx.symbolic_trace(DividedBy("input"))
    [placeholder] = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert scalar_constant(placeholder, gm) is None
    assert scalar_constant(2.0, gm) is None


class Permutes(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.permute(0, 2, 1), torch.permute(x, [2, 0, 1]), x.permute(-1, 0, 1), x.transpose(0, 1)


def test_a_permutations_dimensions_in_each_spelling() -> None:
    gm = fx.symbolic_trace(Permutes())
    found = [permutation(n) for n in gm.graph.nodes if n.op in ("call_method", "call_function")]
    assert found == [(0, 2, 1), (2, 0, 1), (-1, 0, 1), None]  # a transpose is no permute node


@needs_export
def test_atens_permute_has_its_dimensions() -> None:
    gm = torch.export.export(Permutes(), (torch.randn(2, 3, 4),)).module()
    found = [permutation(n) for n in gm.graph.nodes if "permute" in str(n.target)]
    assert found and all(dims is not None and len(dims) == 3 for dims in found)
