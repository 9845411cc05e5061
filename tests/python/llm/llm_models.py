"""Small Hugging Face causal LMs of each family ember.llm knows (random weights, seed 0), and the stock model beside
an optimized copy of it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import ember

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 1024,
}


def config_of(family: str, transformers: Any, **extra: Any) -> Any:
    """A small config of ``family``: Llama 3 RoPE scaling, a Mistral sliding window short enough for generation to
    pass it, Qwen2's q/k/v biases, Qwen3's per-head q/k norms."""
    kw: dict[str, Any] = {**SMALL, **extra}
    if family == "llama":
        kw.setdefault(
            "rope_scaling",
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        return transformers.LlamaConfig(**kw)
    if family == "mistral":
        kw.setdefault("sliding_window", 24)
        return transformers.MistralConfig(**kw)
    if family == "qwen2":
        return transformers.Qwen2Config(**kw)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **kw)
    if family == "gemma2":  # soft caps small enough to bend random weights' scores and logits
        return transformers.Gemma2Config(head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=0.5,
                                         final_logit_softcapping=0.4, sliding_window=12, pad_token_id=0,
                                         hidden_activation="gelu_pytorch_tanh", **kw)  # fmt: skip
    if family == "phi3":
        return transformers.Phi3Config(partial_rotary_factor=0.5, pad_token_id=0, **kw)
    if family == "gpt_neox":
        kw.pop("num_key_value_heads")
        return transformers.GPTNeoXConfig(rotary_pct=0.25, use_parallel_residual=True, **kw)
    if family == "gpt_neox_sequential":
        kw.pop("num_key_value_heads")
        return transformers.GPTNeoXConfig(use_parallel_residual=False, hidden_act="gelu_new", **kw)
    if family == "gpt2":
        sizes = {
            "n_embd": "hidden_size",
            "n_layer": "num_hidden_layers",
            "n_head": "num_attention_heads",
            "n_inner": "intermediate_size",
            "vocab_size": "vocab_size",
            "n_positions": "max_position_embeddings",
        }
        return transformers.GPT2Config(**{name: kw[ours] for name, ours in sizes.items()})
    if family == "mixtral":
        return transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **kw)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                           mlp_only_layers=[1], norm_topk_prob=False, **kw)  # fmt: skip
    if family.startswith("falcon"):
        kw.pop("num_key_value_heads")
        kw.pop("intermediate_size")
        forms = {"falcon": {"multi_query": True, "parallel_attn": True},  # Falcon-7B
                 "falcon_new": {"new_decoder_architecture": True, "num_kv_heads": 2},  # Falcon-40B
                 "falcon_sequential": {"multi_query": False, "parallel_attn": False, "bias": True}}  # fmt: skip
        return transformers.FalconConfig(**{**forms[family], **kw})
    if family == "opt":
        return transformers.OPTConfig(hidden_size=kw["hidden_size"], ffn_dim=kw["intermediate_size"],
                                      num_hidden_layers=kw["num_hidden_layers"], vocab_size=kw["vocab_size"],
                                      num_attention_heads=kw["num_attention_heads"], pad_token_id=1,
                                      word_embed_proj_dim=kw["hidden_size"], max_position_embeddings=1024,
                                      **{k: v for k, v in extra.items() if k == "do_layer_norm_before"})  # fmt: skip
    raise ValueError(family)


FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gpt_neox",
    "gpt_neox_sequential",
    "gpt2",
    "opt",
    "mixtral",
    "qwen2_moe",
    "falcon",
    "falcon_new",
    "falcon_sequential",
    "gemma2",
)


def causal_lm(family: str, **extra: Any) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    # Gemma 2's reference attention is the eager one: transformers before 5.18 ran Gemma 2 on SDPA, which drops its
    # soft cap on the scores (ember applies it, as the model defines it).
    kwargs = {"attn_implementation": "eager"} if family == "gemma2" else {}
    model = transformers.AutoModelForCausalLM.from_config(config_of(family, transformers, **extra), **kwargs)
    return model.eval()


def pair(family: str, dtype: torch.dtype = torch.float32, **extra: Any) -> tuple[nn.Module, nn.Module]:
    """(the stock model in ``dtype``, an ember.llm-optimized copy)."""
    stock = causal_lm(family, **extra).to(dtype)
    optimized = ember.llm.optimize(copy.deepcopy(stock), dtype=dtype)
    return stock, optimized


def prompt(batch: int, length: int, vocab: int = SMALL["vocab_size"], seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
