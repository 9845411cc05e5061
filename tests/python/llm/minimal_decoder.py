"""A Llama written in plain torch (no transformers): the minimal decoder ``ember.llm.optimize`` takes when its parts
carry the Llama table's names and it has a config saying ``model_type="llama"``. Its own forward recomputes the
whole sequence (no cache); generation with it is the reference for ember's cached decode."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class Rotary(nn.Module):
    """(cos, sin) [B or 1, T, D] for position ids, rotate-half layout."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = F.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size)
        self.rotary_emb = Rotary(c.head_dim)


class MinimalLlama(nn.Module):
    """``model.model.layers[i].self_attn.q_proj`` ...: the Llama table's names; ``forward(input_ids)`` -> logits."""

    def __init__(self, vocab: int = 300, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.config = SimpleNamespace(model_type="llama", vocab_size=vocab, hidden_size=hidden,
                                      intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, head_dim=hidden // heads, hidden_act="silu",
                                      use_cache=True)  # fmt: skip
        self.model = Body(self.config)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        cos, sin = self.model.rotary_emb(x, positions)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def greedy(model: nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    """The reference loop: the whole sequence through the forward for each new token."""
    with torch.no_grad():
        for _ in range(new):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids
