"""The module graph mode puts in place of an ``nn.MultiheadAttention`` call (torchvision's ViT and Swin-V1 encoder,
and any model that uses the module): a symbolic trace keeps the module as one call, whose whole forward (input
projection, attention, output projection) torch would run, under autocast on a bf16 copy of its fp32 weights made
on every call. The node runs it on ember's kernels instead:

- the input projection, one GEMM of the stacked Q/K/V weights (``in_proj_weight``) on ember's Linear;
- the attention on ember's flash-attention kernel, reading Q, K and V where they lie in that GEMM's output;
- the output projection on ember's Linear, its input the attention's output as it lies.

It takes self-attention with batch-first inputs (``query is key is value``, ``batch_first=True``), without masks,
attention weights (``need_weights=False``), ``bias_k``/``bias_v`` or ``add_zero_attn``, as torchvision's encoders
call it; every other call, and autograd, runs the module itself. The result has the dtypes torch's module gives
(under a bf16 autocast, bf16).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._optimize.inference import linear
from ember._optimize.inference.common import tensors_allow_fast_path
from ember._optimize.inference.state import LayerState, TensorRef
from ember._tensor import dlpack, sync_threads


def fusable(mha: nn.MultiheadAttention) -> bool:
    """Whether the module's configuration is one the node runs (the call's own arguments are checked per call)."""
    return (
        type(mha) is nn.MultiheadAttention
        and mha.batch_first
        and mha.in_proj_weight is not None  # (None where Q, K and V have weights of their own)
        and mha.bias_k is None
        and mha.bias_v is None
        and not mha.add_zero_attn
        and mha.embed_dim % mha.num_heads == 0
    )


class FusedMultiheadAttention(nn.Module):
    """``nn.MultiheadAttention``'s self-attention on ember's kernels; ``mha`` is the model's module (its weights,
    read where they live, and its forward for every call the node does not take)."""

    def __init__(self, mha: nn.MultiheadAttention, compute: torch.dtype, origin: str) -> None:
        super().__init__()
        self.mha = mha
        self.origin = origin
        bias = TensorRef(mha, "in_proj_bias") if mha.in_proj_bias is not None else None
        self.in_proj = LayerState(compute, TensorRef(mha, "in_proj_weight"), bias)
        self.out_proj = LayerState.of_module(mha.out_proj, compute)

    def forward(
        self,
        query: Any,
        key: Any,
        value: Any,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Any:
        plain = (
            isinstance(query, torch.Tensor)
            and query is key
            and key is value
            and key_padding_mask is None
            and attn_mask is None
            and not need_weights
            and not is_causal
            and query.dim() == 3
            and (self.mha.dropout == 0.0 or not self.mha.training)
        )
        if plain and tensors_allow_fast_path(self.in_proj.tensors() + self.out_proj.tensors(), query):
            out = self._on_kernel(query)
            if out is not None:
                return out, None
        causal = {"is_causal": True} if is_causal else {}  # (torch 1.13's forward has no is_causal)
        return self.mha(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=attn_mask,
            average_attn_weights=average_attn_weights,
            **causal,
        )

    def _on_kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        return self_attention(self.in_proj, self.out_proj, self.mha.num_heads, x)

    def extra_repr(self) -> str:
        return f"{self.origin}: {self.mha.num_heads} heads of {self.mha.embed_dim // self.mha.num_heads}"


class FusedMultiheadAttentionCall(nn.Module):
    """``F.multi_head_attention_forward`` as dynamo records an ``nn.MultiheadAttention`` call: sequence-first
    self-attention whose weights are arguments of the call, ``(query, in_proj_weight, in_proj_bias,
    out_proj_weight, out_proj_bias)``, the call's other arguments fixed by the graph (checked by the pass); the
    result is the function's, ``(output, None)``, sequence-first. Every call the kernels do not take (autograd, a
    dtype they do not run) runs the function."""

    def __init__(
        self, in_proj: LayerState, out_proj: LayerState, heads: int, dropout: float, training: bool, origin: str
    ) -> None:
        super().__init__()
        self.in_proj = in_proj
        self.out_proj = out_proj
        self.heads = heads
        self.dropout = dropout
        self.training_flag = training  # the call's own `training` argument, not this module's mode
        self.origin = origin

    def forward(
        self, query: Any, in_weight: Any, in_bias: Any, out_weight: Any, out_bias: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        in_tensors, out_tensors = (in_weight, in_bias), (out_weight, out_bias)
        if (
            isinstance(query, torch.Tensor)
            and query.dim() == 3
            and tensors_allow_fast_path(in_tensors + out_tensors, query)
        ):
            out = self_attention(
                self.in_proj, self.out_proj, self.heads, query.transpose(0, 1), in_tensors, out_tensors
            )
            if out is not None:
                return out.transpose(0, 1), None
        result: tuple[torch.Tensor, torch.Tensor | None] = F.multi_head_attention_forward(
            query, query, query, query.shape[-1], self.heads, in_weight, in_bias, None, None, False, self.dropout,
            out_weight, out_bias, training=self.training_flag, need_weights=False,
        )  # fmt: skip
        return result

    def extra_repr(self) -> str:
        return f"{self.origin}: {self.heads} heads"


def self_attention(
    in_proj: LayerState,
    out_proj: LayerState,
    heads: int,
    x: torch.Tensor,
    in_tensors: tuple[torch.Tensor | None, ...] | None = None,
    out_tensors: tuple[torch.Tensor | None, ...] | None = None,
) -> torch.Tensor | None:
    """Self-attention of a batch-first ``x`` [b, l, e] on ember's kernels (None where a kernel does not take the
    call): the stacked Q/K/V projection as one GEMM, the attention reading Q, K and V where that GEMM wrote them,
    the output projection. ``*_tensors``: the projections' (weight, bias) where the caller holds them."""
    qkv = linear.run(in_proj, x, (), None, in_tensors)
    if qkv is None or qkv.dtype not in (torch.float32, torch.bfloat16):
        return None
    batch, length, _ = x.shape
    features = qkv.shape[-1] // (3 * heads)
    # [b, l, 3, h, d] where the GEMM wrote it; each of q, k, v seen as [b, h, l, d] without a copy.
    q, k, v = qkv.view(batch, length, 3, heads, features).permute(2, 0, 3, 1, 4).unbind(0)
    out = torch.empty((batch, length, heads, features), dtype=qkv.dtype)
    sync_threads()
    _C.scaled_dot_product_attention(
        dlpack(q), dlpack(k), dlpack(v), None, False, 1.0 / math.sqrt(features), dlpack(out.transpose(1, 2))
    )
    return linear.run(out_proj, out.view(batch, length, heads * features), (), None, out_tensors)
