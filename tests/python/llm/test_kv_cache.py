"""ember.llm.KVCache as generate and the forward use it: what it holds (no padding, blocks of 64 tokens, memory
within 5% of the keys' and values' bytes), a pool reused across generations, and its Hugging Face answers."""

from __future__ import annotations

import pytest
import torch
from llm_models import pair, prompt

import ember

pytest.importorskip("transformers")


def kv_bytes(model: torch.nn.Module, tokens: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * tokens * 2  # bf16


def test_cache_holds_each_sequences_tokens_and_no_padding() -> None:
    _, optimized = pair("llama", torch.bfloat16)
    ids = prompt(2, 100)
    mask = torch.ones_like(ids)
    mask[1, :40] = 0
    out = optimized.generate(ids, attention_mask=mask, max_new_tokens=29, min_new_tokens=29, do_sample=False,
                             pad_token_id=0, return_dict_in_generate=True)  # fmt: skip
    cache = out.past_key_values
    assert isinstance(cache, ember.llm.KVCache)
    assert cache.get_seq_length() == 128  # as Hugging Face counts positions
    assert cache.paged.lengths() == [128, 88]  # (the last token's keys are never needed: 100 + 28)
    # 128 tokens: two blocks; 88: two blocks. Nothing beyond whole blocks.
    assert cache.nbytes == kv_bytes(optimized, 4 * 64)


def test_cache_memory_is_within_five_percent_of_its_bytes() -> None:
    _, optimized = pair("qwen2", torch.bfloat16)
    ids = prompt(8, 300)
    out = optimized.generate(ids, max_new_tokens=9, min_new_tokens=9, do_sample=False, pad_token_id=0,
                             return_dict_in_generate=True)  # fmt: skip
    stored = kv_bytes(optimized, 8 * 308)
    assert stored <= out.past_key_values.nbytes <= 1.05 * stored
    pool = out.past_key_values.pool
    assert pool.bytes <= 1.07 * stored  # what the pool mapped: the blocks in use and its growth's slack


def test_generations_reuse_the_pools_blocks() -> None:
    _, optimized = pair("llama", torch.bfloat16)
    ids = prompt(2, 70)
    optimized.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    pool = optimized._ember_llm.pool
    blocks = pool.blocks
    assert pool.blocks_in_use == 0  # the generation's cache gave its blocks back
    optimized.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert pool.blocks == blocks


def test_max_sizes_reserve_the_pool_ahead() -> None:
    from llm_models import causal_lm

    model = ember.llm.optimize(causal_lm("llama"), max_batch_size=4, max_seq_len=200)
    pool = model._ember_llm.pool
    assert pool.blocks == 4 * 4  # 200 tokens: 4 blocks of 64
    model.generate(prompt(4, 150), max_new_tokens=50, min_new_tokens=50, do_sample=False, pad_token_id=0)
    assert pool.blocks == 16


def test_crop_and_reorder_follow_hugging_faces_positions() -> None:
    stock, optimized = pair("llama")
    ids = prompt(2, 20)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        cache = optimized(ids, attention_mask=mask, use_cache=True).past_key_values
        assert cache.paged.lengths() == [15, 20]
        cache.crop(-4)
        assert cache.get_seq_length() == 16
        assert cache.paged.lengths() == [11, 16]
        cache.reorder_cache(torch.tensor([1, 1]))
        assert cache.paged.lengths() == [16, 16]
        # The cropped, reordered cache continues as the second sequence's first 16 positions would.
        nxt = ids[1:2, 16:20].expand(2, 4)
        got = optimized(nxt, past_key_values=cache, use_cache=True).logits
        want = stock(ids[1:2]).logits[:, 16:20]
    torch.testing.assert_close(got, want.expand(2, 4, -1), rtol=1e-4, atol=1e-4)


def test_a_cache_serves_only_its_own_model() -> None:
    _, a = pair("llama")
    _, b = pair("llama")
    ids = prompt(1, 4)
    with torch.no_grad():
        cache = a(ids, use_cache=True).past_key_values
        with pytest.raises(ValueError, match="another model"):
            b(ids, past_key_values=cache)
        with pytest.raises(ValueError, match="sequences"):
            a(prompt(2, 4), past_key_values=cache)
        with pytest.raises(NotImplementedError):
            cache.update(torch.zeros(1), torch.zeros(1), 0)
