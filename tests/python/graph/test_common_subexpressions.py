"""The common-subexpression pass (ember._optimize.graph.common_subexpressions): a pure, deterministic operation
repeated on the same operands is computed once; not across an in-place write or an unknown call, not where a result's
memory is written afterwards (through a view too), not for operands that differ only in type (1 and 1.0) or sign
of zero, and not for random operations."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, captured, close, exported
from torch import fx, nn

from ember._optimize.graph.common_subexpressions import eliminate_common_subexpressions


def _count(gm: fx.GraphModule, name: str) -> int:
    return sum(1 for n in gm.graph.nodes if name in str(n.target))


class Twice(nn.Module):
    """The same softmax of the same input, computed twice (as two layers would), read by two consumers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.softmax(x * 0.5, dim=-1)
        b = F.softmax(x * 0.5, dim=-1)
        return a + 2 * b


def test_a_repeated_computation_is_shared() -> None:
    gm = captured(Twice(), torch.randn(3, 8))
    assert eliminate_common_subexpressions(gm) == 2  # the scale, then the softmax reading the one scale
    assert _count(gm, "softmax") == 1
    x = torch.randn(5, 8)
    assert close(gm(x), Twice()(x))


class Differs(nn.Module):
    """Operations alike but for an attribute's type or the sign of a zero: not the same computation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            (x + 1) * (x + 1.0) + torch.clamp(x, min=0.0) - torch.clamp(x, min=-0.0) + F.softmax(x, 0) + F.softmax(x, 1)
        )


def test_operands_that_differ_are_not_shared() -> None:
    gm = captured(Differs(), torch.randn(3, 8))
    assert eliminate_common_subexpressions(gm) == 0


class WriteBetween(nn.Module):
    """``x * 2`` before and after ``x`` is written in place: two values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        a = x * 2
        x.add_(1)
        b = x * 2
        return a + b


class ResultWritten(nn.Module):
    """Two equal products, one of which is written afterwards through a view of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        b = x * 2
        a.view(-1).mul_(3)
        return a + b


@pytest.mark.parametrize("model", [WriteBetween(), ResultWritten()], ids=lambda m: type(m).__name__)
def test_an_in_place_write_forbids_sharing(model: nn.Module) -> None:
    gm = captured(model, torch.randn(4, 3))
    assert eliminate_common_subexpressions(gm) == 0
    x = torch.randn(4, 3)
    assert close(gm(x.clone()), model(x.clone()))


def test_an_unknown_call_between_forbids_sharing() -> None:
    gm = captured(Twice(), torch.randn(3, 8))
    first_scale = next(n for n in gm.graph.nodes if n.target is operator.mul)
    with gm.graph.inserting_after(first_scale):
        gm.graph.call_function(print, ("an effect",))
    gm.recompile()
    # The softmaxes read different scales (one before the print, one after): nothing matches.
    assert eliminate_common_subexpressions(gm) == 0


def test_a_detach_in_place_between_is_no_effect() -> None:
    """torch.export detaches each constant it lifts out of a forward in place (``aten.detach_``, DeBERTa's per-layer
    scale): a change of autograd metadata only, which must not keep the layers' repeated masks apart."""
    gm = captured(Twice(), torch.randn(3, 8))
    first_scale = next(n for n in gm.graph.nodes if n.target is operator.mul)
    with gm.graph.inserting_after(first_scale):
        gm.graph.call_function(torch.ops.aten.detach_.default, (first_scale,))
    gm.recompile()
    assert eliminate_common_subexpressions(gm) == 2  # the second scale and softmax read the first ones
    x = torch.randn(3, 8)
    assert close(gm(x), Twice()(x))


class Masks(nn.Module):
    """T5's pattern (transformers 5): every layer combines one shared bias with one mask, ``where(mask, bias, min)``;
    and two random draws, which are not one."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = x.mean(0)
        low = torch.finfo(x.dtype).min
        y = x
        for _ in range(3):
            y = torch.softmax(y + torch.where(mask, bias, low), dim=-1)
        return y + torch.rand_like(y) * 0 + torch.rand_like(y) * 0


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_the_aten_form_shares_the_per_layer_mask_but_not_random_draws() -> None:
    x, mask = torch.randn(4, 4), torch.rand(4, 4) > 0.3
    gm = exported(Masks(), (x, mask))
    assert _count(gm, "aten.where") == 3 and _count(gm, "rand_like") == 2
    assert eliminate_common_subexpressions(gm) >= 2
    assert _count(gm, "aten.where") == 1 and _count(gm, "rand_like") == 2
    assert close(gm(x, mask), Masks()(x, mask))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_t5s_attentions_share_their_masks_after_every_pass() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=64)
    model = transformers.T5Model(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    sample = {"input_ids": ids, "decoder_input_ids": ids[:, :5], "use_cache": False}
    gm = all_passes(model, sample, export=True)
    attentions = [n for n in gm.graph.nodes if n.op == "call_module" and "fusedattention" in str(n.target)]
    masks = {n.args[3] if len(n.args) > 3 else n.kwargs.get("mask") for n in attentions}
    assert len(attentions) == 6 and len(masks) <= 3  # encoder, decoder, cross: one mask each
    with torch.no_grad():
        got, expected = gm(**sample), model(**sample)
    assert close(got[0], expected.last_hidden_state)
