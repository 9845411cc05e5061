"""Keeps nn.TransformerEncoderLayer off torch's fused inference kernel where that kernel ignores CPU autocast.

In eval mode without gradients, ``nn.TransformerEncoderLayer`` (and ``nn.TransformerEncoder`` around it) hand the
whole layer to one fused kernel, ``torch._transformer_encoder_layer_fwd``. Torch 2.x runs that kernel under CPU
autocast. Torch 1.13 checks only for CUDA autocast and calls it anyway, and the kernel fails ("expected scalar
type BFloat16 but found Float"), with the bf16 weights ember gives the layer and with fp32 weights alike; the
validation loop of a model trained under ember would break there. A one-off probe finds out whether the running
torch has this fault. Where it does, ember clears the layer's ``activation_relu_or_gelu`` flag, one of the
conditions of the fused path (it has no other use), and the layer runs its composite path, op by op under
autocast, as in training.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def fused_encoder_fails_under_autocast() -> bool:
    """Whether the running torch's fused encoder-layer kernel fails under CPU autocast, with fp32 weights (level
    O0) or with the bf16 weights of level O1."""
    for weight_dtype in (torch.float32, torch.bfloat16):
        layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True).eval()
        for module in (layer.self_attn, layer.self_attn.out_proj, layer.linear1, layer.linear2):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(weight_dtype)
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                layer(torch.ones(1, 3, 4))
        except RuntimeError:
            return True
    return False


def keep_encoder_layers_off_fused_kernel(model: nn.Module) -> int:
    """Sends ``model``'s TransformerEncoderLayers down their composite path if the fused kernel would fail;
    returns how many it changed."""
    layers = [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer) and m.activation_relu_or_gelu]
    if not layers or not fused_encoder_fails_under_autocast():
        return 0
    for layer in layers:
        layer.activation_relu_or_gelu = False
    return len(layers)
