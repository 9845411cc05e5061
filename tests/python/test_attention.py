"""ember.nn.MultiheadAttention: torch's attention with ember's dropout on the probabilities in training.

Without dropout the composite must equal torch's module (every layout and mask kind); with dropout, the output
must be the composite of the dropped probabilities it reports, the gradients those of that composite, and the
dropped fraction p; everything else goes to torch's forward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
from ember.nn import MultiheadAttention
from ember.nn.attention import attention_forward

EMBED, HEADS, L, S, N = 16, 4, 5, 7, 3


def pair(**kwargs) -> tuple[nn.MultiheadAttention, MultiheadAttention]:
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(EMBED, HEADS, **kwargs)
    ours = copy.deepcopy(theirs)
    ours.__class__ = MultiheadAttention
    return theirs, ours


def inputs(batch_first: bool, kdim: int = EMBED, vdim: int = EMBED, batched: bool = True):
    gen = torch.Generator().manual_seed(1)

    def make(length: int, dim: int) -> torch.Tensor:
        shape = ((N, length, dim) if batch_first else (length, N, dim)) if batched else (length, dim)
        return torch.randn(shape, generator=gen)

    return make(L, EMBED), make(S, kdim), make(S, vdim)


MASKS = {
    "none": lambda: (None, None),
    "bool attn 2-D": lambda: (torch.rand(L, S, generator=torch.Generator().manual_seed(2)) > 0.7, None),
    "float attn 3-D": lambda: (torch.randn(N * HEADS, L, S, generator=torch.Generator().manual_seed(3)), None),
    "bool padding": lambda: (None, torch.tensor([[False] * S, [False] * (S - 2) + [True] * 2, [True] + [False] * 6])),
    "bool padding + bool causal attn": lambda: (
        torch.triu(torch.ones(L, S, dtype=torch.bool), diagonal=1),
        torch.tensor([[False] * S, [False] * (S - 3) + [True] * 3, [False] * S]),
    ),
}


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", list(MASKS))
@pytest.mark.parametrize("need_weights, average", [(False, True), (True, True), (True, False)])
def test_composite_without_dropout_equals_torch(batch_first, masks, need_weights, average):
    theirs, ours = pair(batch_first=batch_first)
    attn_mask, padding = MASKS[masks]()
    q, k, v = inputs(batch_first)
    expected = theirs(q, k, v, key_padding_mask=padding, attn_mask=attn_mask, need_weights=need_weights,
                      average_attn_weights=average)  # fmt: skip
    got = attention_forward(ours, q, k, v, padding, need_weights, attn_mask, average, 0.0)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    if need_weights:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-6)
    else:
        assert got[1] is None


@pytest.mark.parametrize("case", ["self", "self, batch first", "kdim/vdim", "unbatched", "no bias"])
def test_composite_other_configurations(case, monkeypatch):
    kwargs = {"kdim": 6, "vdim": 9} if case == "kdim/vdim" else {"bias": False} if case == "no bias" else {}
    kwargs |= {"batch_first": True} if case == "self, batch first" else {}
    theirs, ours = pair(**kwargs)
    q, k, v = inputs("batch first" in case, kwargs.get("kdim", EMBED), kwargs.get("vdim", EMBED), case != "unbatched")
    if case.startswith("self"):
        k = v = q
    expected, expected_weights = theirs(q, k, v)
    projections = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: projections.append(a[1].shape) or linear(*a))
    got, weights = attention_forward(ours, q, k, v, None, True, None, True, 0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)
    if case.startswith("self"):  # one matmul with the packed q/k/v weight, then the output projection
        assert projections == [(3 * EMBED, EMBED), (EMBED, EMBED)]


@pytest.mark.parametrize("batch_first", [False, True])
def test_training_with_dropout_is_the_composite_of_its_dropped_probabilities(batch_first):
    _, ours = pair(dropout=0.3, batch_first=batch_first)
    ours.train()
    q, k, v = (t.requires_grad_() for t in inputs(batch_first))
    out, dropped = ours(q, k, v, need_weights=True, average_attn_weights=False)
    assert dropped.shape == (N, HEADS, L, S)
    # Dropped fraction (keeping sigma small needs more elements than one call: pool a few).
    zeros = [(ours(q, k, v, need_weights=True, average_attn_weights=False)[1] == 0).float().mean() for _ in range(40)]
    assert abs(torch.stack(zeros).mean().item() - 0.3) < 0.05
    # The output is out_proj(dropped @ v_heads), and backward goes through the same mask.
    mask = (dropped != 0).float().detach()

    def recompute(q, k, v):
        probs = attention_forward(ours, q, k, v, None, True, None, False, 0.0)[1]
        kept = probs * mask / 0.7
        v_proj = nn.functional.linear(v, ours.in_proj_weight[2 * EMBED :], ours.in_proj_bias[2 * EMBED :])
        v_heads = (v_proj.transpose(0, 1) if batch_first else v_proj).reshape(S, N, HEADS, EMBED // HEADS)
        mixed = torch.einsum("nhls,snhd->lnhd", kept, v_heads).reshape(L, N, EMBED)
        result = ours.out_proj(mixed)
        return result.transpose(0, 1) if batch_first else result

    expected = recompute(q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, ours.in_proj_weight), g)
    expected_grads = torch.autograd.grad(expected, (q, k, v, ours.in_proj_weight), g)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_falls_back_to_torch_where_it_should():
    theirs, ours = pair(dropout=0.3)
    q, k, v = inputs(False)
    ours.eval()
    theirs.eval()
    assert torch.equal(ours(q, k, v)[0], theirs(q, k, v)[0])  # eval: torch's forward
    _, bias_kv = pair(dropout=0.3, add_bias_kv=True)
    torch.manual_seed(9)
    a = bias_kv(q, k, v)[0]
    torch.manual_seed(9)
    b = nn.MultiheadAttention.forward(bias_kv, q, k, v)[0]
    assert torch.equal(a, b)  # a configuration the ember path does not cover: torch's forward, torch's masks
    with pytest.raises(RuntimeError, match="is_causal"):
        ours.train()(q, q, q, is_causal=True)


def test_bad_inputs_get_torchs_errors():
    _, ours = pair(dropout=0.3)
    q, k, v = inputs(False)
    with pytest.raises((AssertionError, RuntimeError)):
        ours(q, k[:, :2], v)  # batch sizes differ


def test_under_autocast_and_in_an_encoder_layer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(EMBED, HEADS, dim_feedforward=32, dropout=0.2, batch_first=True)
    optimizer = torch.optim.AdamW(layer.parameters())
    model, optimizer = ember.optimize(layer, optimizer=optimizer, dtype=torch.bfloat16)
    assert type(model.self_attn) is MultiheadAttention
    x = torch.randn(N, L, EMBED)
    out = model(x)
    assert out.dtype == torch.float32 and out.shape == x.shape  # autocast computes inside, the norm outputs fp32
    out.sum().backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
