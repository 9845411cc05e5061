"""gather_masks: masks added to attention scores through views of them (Swin's shifted windows) gathered into one
mask, so that the attention runs on ember's kernel."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, all_passes, captured, close, fused_attention, within_autocast_error
from torch import nn

import ember
from ember._optimize.graph.attention_mask import gather_masks

HEADS, LENGTH, WINDOWS, FEATURES = 3, 16, 4, 8


class ShiftedWindows(nn.Module):
    """torchvision's Swin attention after its projection: the scores plus the relative-position bias, then each
    window's mask added through a view that splits the windows from the batch, and the view back."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(HEADS, LENGTH, LENGTH))

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = (q * FEATURES**-0.5) @ k.transpose(-2, -1)
        attn = attn + self.bias.unsqueeze(0)
        n = mask.shape[0]
        attn = attn.view(attn.size(0) // n, n, HEADS, attn.size(-2), attn.size(-1))
        attn = attn + mask.unsqueeze(1).unsqueeze(0)
        return attn.view(-1, HEADS, attn.size(-2), attn.size(-1))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scores(q, k, mask), dim=-1) @ v


class HuggingFaceWindows(ShiftedWindows):
    """Hugging Face's Swin: the sizes from the input's, a division by the root of the features, ``nn.functional``."""

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, dim = q.shape[0], q.shape[2]
        attn = torch.matmul(q, k.transpose(-1, -2)) / FEATURES**0.5
        attn = attn + self.bias.unsqueeze(0)
        n = mask.shape[0]
        attn = attn.view(batch // n, n, HEADS, dim, dim) + mask.unsqueeze(1).unsqueeze(0)
        return attn.view(-1, HEADS, dim, dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.matmul(nn.functional.softmax(self.scores(q, k, mask), dim=-1), v)


class TwoBiases(ShiftedWindows):
    """Two adds and no view: gathered as well."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = q @ k.transpose(-2, -1) + self.bias + mask[:1]
        return torch.softmax(attn, dim=-1) @ v


class ScaledInBetween(ShiftedWindows):
    """A multiplication between the views: not a mask added, so the chain stays."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = (q @ k.transpose(-2, -1) + self.bias).view(-1, WINDOWS, HEADS, LENGTH, LENGTH) * 0.5
        attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, HEADS, LENGTH, LENGTH)
        return torch.softmax(attn, dim=-1) @ v


class KeepsBiasedScores(ShiftedWindows):
    """The scores with the bias are returned too: the chain's first value has a reader outside it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Any:
        biased = q @ k.transpose(-2, -1) + self.bias
        attn = (biased.view(-1, WINDOWS, HEADS, LENGTH, LENGTH) + mask.unsqueeze(1).unsqueeze(0)).view(biased.shape)
        return torch.softmax(attn, dim=-1) @ v, biased


class NotViewedBack(ShiftedWindows):
    """The views end in another shape than the scores' (the probabilities broadcast against v): no single mask."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = (q @ k.transpose(-2, -1) + self.bias).view(-1, WINDOWS, HEADS, LENGTH, LENGTH)
        return torch.softmax(attn + mask.unsqueeze(1).unsqueeze(0), dim=-1) @ v[:WINDOWS]


def _inputs(batch: int = 2) -> tuple[torch.Tensor, ...]:
    """q, k, v of ``batch`` images of WINDOWS windows each, and each window's mask (0 kept, -100 apart: Swin's)."""
    q, k, v = (torch.randn(batch * WINDOWS, HEADS, LENGTH, FEATURES) for _ in range(3))
    mask = torch.zeros(WINDOWS, LENGTH, LENGTH)
    mask[1:, : LENGTH // 2, LENGTH // 2 :] = -100.0
    mask[1:, LENGTH // 2 :, : LENGTH // 2] = -100.0
    return q, k, v, mask


def _forms() -> list[bool]:
    return [False, True] if HAS_EXPORT_AUTO else [False]


@pytest.mark.parametrize("export", _forms(), ids=lambda e: "export" if e else "trace")
@pytest.mark.parametrize("form", [ShiftedWindows, HuggingFaceWindows, TwoBiases], ids=lambda m: m.__name__)
def test_masks_added_through_views_are_gathered(form: type[nn.Module], export: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)  # the bias and the inputs the same whatever ran before
    model = form().eval()
    inputs = _inputs()
    with torch.no_grad():
        gm = all_passes(model, inputs, export=export)
        assert len(fused_attention(gm)) == 1
        assert close(gm(*inputs), model(*inputs))
        assert kernel_calls[0] == 1
        other = _inputs(batch=3)  # another batch, in the graph of any batch
        assert close(gm(*other), model(*other))
        exact = model(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, autocast = gm(*inputs), model(*inputs)
        assert got.dtype == autocast.dtype == torch.bfloat16
        assert within_autocast_error(got, exact, autocast)


@pytest.mark.parametrize("model", [ScaledInBetween(), KeepsBiasedScores()], ids=lambda m: type(m).__name__)
def test_chains_that_are_no_added_mask_stay(model: nn.Module, kernel_calls: list[int]) -> None:
    inputs = _inputs()
    model.eval()
    gm = captured(model, inputs)
    assert gather_masks(gm) == 0
    with torch.no_grad():
        got, expected = all_passes(model, inputs)(*inputs), model(*inputs)
    pairs = zip(got, expected) if isinstance(got, tuple) else [(got, expected)]
    assert all(close(g, e) for g, e in pairs)
    assert kernel_calls[0] == 0


def test_views_to_another_shape_raise_rather_than_compute_something_else() -> None:
    """A graph without recorded shapes (symbolic tracing) is checked per call; ember.optimize then keeps the
    model's own forward, and a graph that records them is not rewritten."""
    model = NotViewedBack().eval()
    inputs = _inputs()
    gm = captured(model, inputs)
    assert gather_masks(gm) == 1
    with pytest.raises(RuntimeError, match="gathered mask does not apply"), torch.no_grad():
        gm(*inputs)
    optimized = ember.optimize(model, graph_mode=True, sample_input=inputs)
    with torch.no_grad():
        assert close(optimized(*inputs), model(*inputs))
    if HAS_EXPORT_AUTO:
        with torch.no_grad():
            exported = all_passes(model, inputs, export=True)
            assert close(exported(*inputs), model(*inputs))
        assert not any(
            n.op == "call_function" and getattr(n.target, "__name__", "") == "scores_mask" for n in exported.graph.nodes
        )


def test_autograd_reaches_the_bias_through_the_gathered_mask() -> None:
    torch.manual_seed(0)
    model = ShiftedWindows()
    inputs = _inputs()
    gm = all_passes(model, inputs)
    assert fused_attention(gm)
    model.train()
    gm(*inputs).sum().backward()
    gathered = model.bias.grad.clone()
    model.bias.grad = None
    model(*inputs).sum().backward()
    assert torch.allclose(gathered, model.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile: torch >= 2.0")
def test_the_dynamo_backend_gathers_window_masks(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    inputs = _inputs()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        got, expected = compiled(*inputs), model(*inputs)
    assert kernel_calls[0] == 1
    assert close(got, expected)
    torch._dynamo.reset()


def test_the_gathered_graph_reads_sizes_from_the_mask_chain() -> None:
    """``attn.size(0) // windows``: symbolic tracing reads sizes of the chain's values, which the rewrite takes from
    the gathered mask's chain (same shapes), so the scores keep one reader."""
    model = ShiftedWindows().eval()
    gm = captured(model, _inputs())
    gather_masks(gm)
    matmuls = [n for n in gm.graph.nodes if n.op == "call_function" and "matmul" in str(n.target)]
    scores = matmuls[0]
    assert len(scores.users) == 1
