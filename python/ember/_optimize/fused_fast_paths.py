"""Keeps torch's fused eval-mode kernels for encoder layers and self-attention off where they ignore CPU autocast.

In eval mode without gradients, ``nn.TransformerEncoderLayer`` (and ``nn.TransformerEncoder`` around it) hand the
whole layer to one fused kernel, ``torch._transformer_encoder_layer_fwd``, and ``nn.MultiheadAttention`` hands
self-attention to ``torch._native_multi_head_attention``. Torch 2.x runs them under CPU autocast. Torch 1.13
checks only for CUDA autocast and calls them anyway, and they fail ("expected scalar type BFloat16 but found
Float"); the validation loop of a model trained under ember would break there, and so would a bf16 inference
model such as torchvision's ViT, whose attention modules keep their fp32 weights. One-off probes find out whether
the running torch has these faults. Where it does:

- an encoder layer gets its ``activation_relu_or_gelu`` flag cleared, one of the conditions of the fused path (it
  has no other use), and runs its composite path, op by op under autocast, as in training;
- a MultiheadAttention gets an instance forward (``CompositeAttentionForward``) that hands the class's forward
  the key as a view of the query, not the query itself: self-attention is the fused kernel's first condition,
  checked by identity, so the composite path runs on the same values. It projects the query apart from the key
  and value (two matmuls instead of one), on torch 1.13 under autocast only.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
from torch import nn

from ember._optimize.autocast_forward import AutocastForward


@functools.cache
def fused_encoder_fails_under_autocast() -> bool:
    """Whether the running torch's fused encoder-layer kernel fails under CPU autocast, with fp32 weights (level
    O0) or with the bf16 weights of level O1."""
    for weight_dtype in (torch.float32, torch.bfloat16):
        layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True).eval()
        for module in (layer.self_attn, layer.self_attn.out_proj, layer.linear1, layer.linear2):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(weight_dtype)
        if _fails_under_autocast(layer, torch.ones(1, 3, 4)):
            return True
    return False


@functools.cache
def fused_attention_fails_under_autocast() -> bool:
    """Whether the running torch's fused self-attention kernel fails under CPU autocast, with fp32 weights and
    inputs (the attention of a bf16 inference model keeps its fp32 weights) or bf16 ones."""
    for dtype in (torch.float32, torch.bfloat16):
        attention = nn.MultiheadAttention(4, 2, batch_first=True).eval().to(dtype)
        x = torch.ones(1, 3, 4, dtype=dtype)
        if _fails_under_autocast(attention, x, x, x):
            return True
    return False


def _fails_under_autocast(module: nn.Module, *inputs: torch.Tensor) -> bool:
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            module(*inputs)
    except RuntimeError:
        return True
    return False


class CompositeAttentionForward:
    """Calls ``type(module).forward`` with the key (and the value, when it is the key) as a view of the query, so
    that torch 1.13's fused self-attention kernel, which fails under CPU autocast, is not taken. A plain picklable
    object, so ``copy.deepcopy`` and ``torch.save`` of the model keep working."""

    _ember_forward = True

    def __init__(self, module: nn.MultiheadAttention) -> None:
        self.module = module

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if query is key:
            shared_value = value is key
            key = key.view_as(key)
            if shared_value:
                value = key
        return type(self.module).forward(self.module, query, key, value, *args, **kwargs)

    def __repr__(self) -> str:
        return f"CompositeAttentionForward({type(self.module).__name__})"


def _attention_without_composite(module: nn.Module) -> bool:
    """A MultiheadAttention whose forward is the class's, or, where the model is the attention module itself,
    ember's autocast forward around the class's."""
    if not isinstance(module, nn.MultiheadAttention):
        return False
    forward = module.__dict__.get("forward")
    return forward is None or (isinstance(forward, AutocastForward) and forward.inner is None)


def keep_off_fused_kernels(model: nn.Module) -> tuple[int, int]:
    """Sends ``model``'s TransformerEncoderLayers and MultiheadAttention modules down their composite paths if the
    running torch's fused kernels would fail under CPU autocast; returns how many of each it changed."""
    encoders = [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer) and m.activation_relu_or_gelu]
    attentions = [m for m in model.modules() if _attention_without_composite(m)]
    changed_encoders = changed_attentions = 0
    if encoders and fused_encoder_fails_under_autocast():
        for layer in encoders:
            layer.activation_relu_or_gelu = False
        changed_encoders = len(encoders)
    if attentions and fused_attention_fails_under_autocast():
        for attention in attentions:
            forward = attention.__dict__.get("forward")
            composite = CompositeAttentionForward(cast(nn.MultiheadAttention, attention))
            if isinstance(forward, AutocastForward):  # the model is the attention: its forward runs under autocast
                forward.inner = composite
            else:
                attention.forward = composite
        changed_attentions = len(attentions)
    return changed_encoders, changed_attentions


def kept_off_note(encoders: int, attentions: int) -> str | None:
    """The report's line for what keep_off_fused_kernels changed, or None."""
    parts = []
    if encoders:
        parts.append(f"{encoders} TransformerEncoderLayer(s)")
    if attentions:
        parts.append(f"{attentions} MultiheadAttention module(s)")
    if not parts:
        return None
    kernels = "torch's fused eval-mode kernels, which this torch cannot run under CPU autocast"
    return f"{' and '.join(parts)} kept off {kernels}"
