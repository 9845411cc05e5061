"""Graph mode on real architectures the project did not write, fp32 against eager: Hugging Face models (captured by
torch.export, torch >= 2.6) and torchvision's (symbolic tracing, every torch), small configurations with random
weights. The whole list the issue names ran on the VM and the Xeon (docs/guides/graph-mode.md); these are the ones
CI keeps, one per family of graph shapes (Swin's export takes minutes on the 2-core machine: it ran by hand)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, assert_matches, graph_forward
from torch import nn

import ember

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _ids() -> torch.Tensor:
    return torch.randint(3, 100, (2, 12))


def _hugging_face(name: str) -> tuple[nn.Module, dict[str, Any]]:
    t = pytest.importorskip("transformers")
    ids = _ids()
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "deberta_v2":
        return t.DebertaV2Model(t.DebertaV2Config(vocab_size=100, **SMALL)), text
    if name == "qwen2":
        config = t.Qwen2Config(vocab_size=100, num_key_value_heads=1, **SMALL)
        return t.Qwen2Model(config), {**text, "use_cache": False}
    if name == "t5":
        config = t.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
        return t.T5Model(config), {"input_ids": ids, "decoder_input_ids": ids, "use_cache": False}
    config = t.Wav2Vec2Config(
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, **SMALL,
    )  # fmt: skip
    return t.Wav2Vec2Model(config), {"input_values": torch.randn(2, 800)}


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize("name", ["deberta_v2", "qwen2", "t5", "wav2vec2"])
def test_hugging_face_architectures(name: str) -> None:
    torch.manual_seed(0)
    model, sample = _hugging_face(name)
    model.eval()
    optimized = ember.optimize(model, graph_mode=True, sample_input=sample)
    assert graph_forward(optimized).path == "torch.export"
    assert_matches(optimized, model, sample, 1e-5, 1e-5)


def _torchvision(name: str) -> Callable[[], nn.Module]:
    torchvision = pytest.importorskip("torchvision")
    if name == "fpn backbone":
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

        if "weights" in inspect.signature(resnet_fpn_backbone).parameters:
            return lambda: resnet_fpn_backbone(backbone_name="resnet18", weights=None)
        return lambda: resnet_fpn_backbone("resnet18", False)
    return getattr(torchvision.models, name)


@pytest.mark.parametrize(
    "name",
    ["resnext50_32x4d", "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf", "densenet121", "fpn backbone"],
)
def test_torchvision_architectures(name: str) -> None:
    torch.manual_seed(0)
    model = _torchvision(name)().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # statistics far from the identity, so a wrong fold shows
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.running_mean, -0.1, 0.1)
    x = torch.randn(2, 3, 64, 64)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x)
    assert graph_forward(optimized).path == "torch.fx symbolic trace"
    with torch.no_grad():
        got, expected = optimized(x), model(x)
    if isinstance(expected, dict):  # the FPN's feature maps
        got, expected = list(got.values()), list(expected.values())
    for g, e in zip(got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * float(e.abs().max()))
