"""ember.llm.optimize on a decoder written in plain torch (no transformers, so it runs under torch 1.13 too): the
forward returns (logits, cache), and a greedy loop carrying the cache by hand gives the tokens the model's own
full-recompute loop gives."""

from __future__ import annotations

import copy

import torch
from minimal_decoder import MinimalLlama, greedy

import ember


def cached_greedy(model: torch.nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    with torch.no_grad():
        logits, cache = model(ids, use_cache=True)[:2]
        for _ in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            logits, cache = model(token, past_key_values=cache, use_cache=True)[:2]
    return ids


def test_a_plain_torch_decoder_generates_the_same_tokens(isa_level: str) -> None:
    torch.manual_seed(0)
    reference = MinimalLlama().eval()
    optimized = ember.llm.optimize(copy.deepcopy(reference), dtype=torch.float32)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(3))
    assert torch.equal(cached_greedy(optimized, ids, 40), greedy(reference, ids, 40))


def test_a_plain_torch_decoder_returns_logits_and_an_ember_cache() -> None:
    torch.manual_seed(0)
    optimized = ember.llm.optimize(MinimalLlama().eval(), dtype=torch.bfloat16)
    out = optimized(torch.randint(0, 300, (1, 5)), use_cache=True)
    logits, cache = out[0], out[1]
    assert logits.shape == (1, 5, 300) and logits.dtype == torch.bfloat16
    assert isinstance(cache, ember.llm.KVCache)
    assert cache.get_seq_length() == 5
