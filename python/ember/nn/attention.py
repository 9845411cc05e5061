"""``nn.MultiheadAttention`` whose attention-probability dropout runs on ember's kernel when training.

In training, torch's attention with dropout cannot take a fused kernel: it computes softmax(q k^T / sqrt(d) + mask),
draws a dropout mask over the whole (batch x heads x L x S) probability tensor from its serial generator, and
keeps that mask for backward. In a BERT-base step those 12 dropouts cost more than the attention's matmuls. This
module computes the same composite (the formula of torch's ``need_weights=True`` path, which its other paths
equal) with ``ember.nn.functional.dropout`` on the probabilities: the masks come from a parallel counter-based
generator and nothing is stored for them.

Everything else is torch's: in eval mode, with dropout 0, and for the configurations this path does not cover
(``add_bias_kv``, ``add_zero_attn``, nested tensors), ``forward`` is ``nn.MultiheadAttention.forward``.
Parameters, ``state_dict`` and ``repr`` are those of ``nn.MultiheadAttention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ember._compat import attention_packs_in_proj, mha_shape_check
from ember.nn.dropout import dropout

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in for ``torch.nn.MultiheadAttention``; see the module docstring for what differs (the dropout masks)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self._takes_ember_path(query, key, value):
            kwargs = {"is_causal": is_causal} if is_causal else {}  # torch 1.13's forward has no is_causal
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, **kwargs
            )
        if is_causal and attn_mask is None:
            # torch's rule: is_causal is a hint about attn_mask, which must be given.
            raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
        return attention_forward(
            self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, self.dropout
        )

    def _takes_ember_path(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
        return (
            self.training
            and self.dropout > 0.0
            and self.bias_k is None
            and self.bias_v is None
            and not self.add_zero_attn
            and not any(t.is_nested for t in (query, key, value))
        )


def attention_forward(
    module: nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    need_weights: bool,
    attn_mask: torch.Tensor | None,
    average_attn_weights: bool,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``module``'s attention with ``dropout_p`` applied to the probabilities by ember's dropout (0: none)."""
    batched = _shape_check(query, key, value, key_padding_mask, attn_mask, module.num_heads)
    self_attention = query is key and key is value  # before the layout changes below make three tensors of one
    if module.batch_first and batched:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    if not batched:
        query, key, value = (t.unsqueeze(1) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, batch, embed_dim = query.shape
    src_len = key.shape[0]
    heads = module.num_heads
    head_dim = embed_dim // heads

    q, k, v = _in_projection(module, query, key, value, self_attention)
    q = q.reshape(tgt_len, batch * heads, head_dim).transpose(0, 1)
    k = k.reshape(src_len, batch * heads, head_dim).transpose(0, 1)
    v = v.reshape(src_len, batch * heads, head_dim).transpose(0, 1)

    mask = _additive_mask(attn_mask, key_padding_mask, batch, heads, src_len, q.dtype)
    q = q * (1.0 / math.sqrt(head_dim))
    scores = torch.bmm(q, k.transpose(1, 2)) if mask is None else torch.baddbmm(mask, q, k.transpose(1, 2))
    probs = F.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
    out = torch.bmm(probs, v)  # (batch * heads, tgt_len, head_dim)
    out = out.transpose(0, 1).reshape(tgt_len * batch, embed_dim)
    out = F.linear(out, module.out_proj.weight, module.out_proj.bias).view(tgt_len, batch, embed_dim)

    weights = None
    if need_weights:
        weights = probs.view(batch, heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            weights = weights.squeeze(0)
    if not batched:
        out = out.squeeze(1)
    elif module.batch_first:
        out = out.transpose(0, 1)
    return out, weights


def _shape_check(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    num_heads: int,
) -> bool:
    """Whether the inputs are batched, after torch's own checks of shapes and masks (with torch's messages) where
    this torch has them as a function (1.13 to 2.x do)."""
    if mha_shape_check is not None:
        return bool(mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads))
    if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"query, key and value must all be 2-D or 3-D, got {query.dim()}-D, {key.dim()}-D and "
                         f"{value.dim()}-D")  # fmt: skip
    return query.dim() == 3


def _in_projection(
    module: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, self_attention: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v projections; self-attention with one packed weight is one matmul."""
    bias = module.in_proj_bias
    if attention_packs_in_proj(module):
        if self_attention:
            q, k, v = F.linear(query, module.in_proj_weight, bias).chunk(3, dim=-1)
            return q, k, v
        weights = module.in_proj_weight.chunk(3)
    else:
        weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
    biases = bias.chunk(3) if bias is not None else (None, None, None)
    return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))  # type: ignore[return-value]


def _additive_mask(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    batch: int,
    heads: int,
    src_len: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """attn_mask ((L, S) or (N * H, L, S)) and key_padding_mask ((N, S)) as one additive float mask broadcastable
    to (N * H, L, S): boolean masks give -inf where True, float masks are added as they are (torch's rules)."""
    mask = None
    if attn_mask is not None:
        mask = _as_float(attn_mask, dtype)
        if mask.dim() == 2:
            mask = mask.unsqueeze(0)
    if key_padding_mask is not None:
        padding = _as_float(key_padding_mask, dtype).view(batch, 1, 1, src_len)
        padding = padding.expand(-1, heads, -1, -1).reshape(batch * heads, 1, src_len)
        mask = padding if mask is None else mask + padding
    return mask  # baddbmm broadcasts a (1, L, S) or (N * H, 1, S) mask


def _as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)
