"""Graph mode on real architectures the project did not write, fp32 against eager: Hugging Face models (captured by
torch.export, torch >= 2.6) and torchvision's (symbolic tracing, every torch), small configurations with random
weights. CI runs one model per family of graph shapes; ``EMBER_ALL_MODELS=1`` runs every model the graph-mode issue
names (Swin's export alone takes minutes on a loaded 2-core machine)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, assert_matches, graph_forward, outputs, within_autocast_error
from torch import nn

import ember
from ember._optimize.graph.replay import ReplaySegment
from ember._optimize.inference import linear

ALL = os.environ.get("EMBER_ALL_MODELS") == "1"
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
HEADS = {"encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}


def _text() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 12))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _hugging_face_models(t: Any) -> dict[str, Callable[[], tuple[nn.Module, dict[str, Any]]]]:
    """Each model's builder: the model and its sample input."""
    no_cache = {"use_cache": False}
    return {
        "bert": lambda: (t.BertModel(t.BertConfig(vocab_size=100, **SMALL)), _text()),
        "roberta": lambda: (t.RobertaModel(t.RobertaConfig(vocab_size=100, **SMALL)), _text()),
        "distilbert": lambda: (
            t.DistilBertModel(t.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64)),
            _text(),
        ),
        "albert": lambda: (t.AlbertModel(t.AlbertConfig(vocab_size=100, embedding_size=16, **SMALL)), _text()),
        "deberta_v2": lambda: (t.DebertaV2Model(t.DebertaV2Config(vocab_size=100, **SMALL)), _text()),
        "electra": lambda: (t.ElectraModel(t.ElectraConfig(vocab_size=100, embedding_size=16, **SMALL)), _text()),
        "gpt2": lambda: (
            t.GPT2Model(t.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)),
            {**_text(), **no_cache},
        ),
        "llama": lambda: (
            t.LlamaModel(t.LlamaConfig(vocab_size=100, num_key_value_heads=1, **SMALL)),
            {**_text(), **no_cache},
        ),
        "qwen2": lambda: (
            t.Qwen2Model(t.Qwen2Config(vocab_size=100, num_key_value_heads=1, **SMALL)),
            {**_text(), **no_cache},
        ),
        "mistral": lambda: (
            t.MistralModel(t.MistralConfig(vocab_size=100, num_key_value_heads=1, **SMALL)),
            {**_text(), **no_cache},
        ),
        "t5": lambda: (
            t.T5Model(t.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)),
            {"input_ids": _text()["input_ids"], "decoder_input_ids": _text()["input_ids"], **no_cache},
        ),
        "bart": lambda: (
            t.BartModel(t.BartConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, **HEADS)),
            {**_text(), **no_cache},
        ),
        "vit": lambda: (
            t.ViTModel(t.ViTConfig(image_size=32, patch_size=8, **SMALL)),
            {"pixel_values": torch.randn(2, 3, 32, 32)},
        ),
        "deit": lambda: (
            t.DeiTModel(t.DeiTConfig(image_size=32, patch_size=8, **SMALL)),
            {"pixel_values": torch.randn(2, 3, 32, 32)},
        ),
        "swin": lambda: (
            t.SwinModel(
                t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)
            ),
            {"pixel_values": torch.randn(2, 3, 32, 32)},
        ),
        "clip_text": lambda: (t.CLIPTextModel(t.CLIPTextConfig(vocab_size=100, **SMALL)), _text()),
        "wav2vec2": lambda: (
            t.Wav2Vec2Model(
                t.Wav2Vec2Config(
                    conv_dim=(16, 16),
                    conv_stride=(5, 2),
                    conv_kernel=(10, 3),
                    num_conv_pos_embeddings=8,
                    num_conv_pos_embedding_groups=2,
                    **SMALL,
                )
            ),
            {"input_values": torch.randn(2, 800)},
        ),
        "whisper": lambda: (
            t.WhisperModel(
                t.WhisperConfig(
                    vocab_size=100,
                    d_model=32,
                    encoder_layers=1,
                    decoder_layers=1,
                    num_mel_bins=16,
                    max_source_positions=20,
                    max_target_positions=32,
                    pad_token_id=0,
                    bos_token_id=1,
                    eos_token_id=2,
                    decoder_start_token_id=1,
                    **HEADS,
                )
            ),
            {"input_features": torch.randn(2, 16, 40), "decoder_input_ids": _text()["input_ids"][:, :4], **no_cache},
        ),
    }


HUGGING_FACE_IN_CI = ["deberta_v2", "qwen2", "t5", "wav2vec2"]
HUGGING_FACE = [
    "bert", "roberta", "distilbert", "albert", "deberta_v2", "electra", "gpt2", "llama", "qwen2", "mistral", "t5",
    "bart", "vit", "deit", "swin", "clip_text", "wav2vec2", "whisper",
]  # fmt: skip


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize("name", HUGGING_FACE if ALL else HUGGING_FACE_IN_CI)
def test_hugging_face_architectures(name: str) -> None:
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, sample = _hugging_face_models(t)[name]()
    model.eval()
    optimized = ember.optimize(model, graph_mode=True, sample_input=sample)
    assert graph_forward(optimized).path == "torch.export"
    assert_matches(optimized, model, sample, 1e-5, 1e-5)


def _outputs_of(model: nn.Module, sample: dict[str, Any], bf16: bool) -> list[torch.Tensor]:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return [t.float() for t in outputs(model(**sample)) if t.is_floating_point()]


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.skipif(not ember._C.Linear.supported("bfloat16"), reason="ember's bf16 layers need AVX512-BF16 or AMX")
@pytest.mark.parametrize("name", HUGGING_FACE if ALL else ["qwen2", "bert"])
def test_hugging_face_architectures_in_bf16(name: str) -> None:
    """In bf16, graph mode is held to autocast's own error (graphs.within_autocast_error)."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, sample = _hugging_face_models(t)[name]()
    model.eval()
    exact = _outputs_of(model, sample, bf16=False)
    autocast = _outputs_of(model, sample, bf16=True)
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=sample)
    assert graph_forward(optimized).path == "torch.export"
    got = _outputs_of(optimized, sample, bf16=False)  # the optimized model runs its own autocast
    assert len(got) == len(exact)
    assert all(within_autocast_error(g, e, a) for g, e, a in zip(got, exact, autocast))


def _torchvision(name: str) -> Callable[[], nn.Module]:
    torchvision = pytest.importorskip("torchvision")
    if name == "fpn backbone":
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

        if "weights" in inspect.signature(resnet_fpn_backbone).parameters:
            return lambda: resnet_fpn_backbone(backbone_name="resnet18", weights=None)
        return lambda: resnet_fpn_backbone("resnet18", False)
    if not hasattr(torchvision.models, name):
        pytest.skip(f"torchvision {torchvision.__version__} has no {name}")
    if name == "googlenet":  # ceil-mode max pools, and a stride-1 one in every inception block's fourth branch
        return lambda: torchvision.models.googlenet(aux_logits=False, init_weights=True)
    return getattr(torchvision.models, name)


TORCHVISION_IN_CI = ["resnext50_32x4d", "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf", "densenet121",
                     "fpn backbone", "googlenet"]  # fmt: skip
TORCHVISION = [
    "resnet50", "resnext50_32x4d", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0",
    "efficientnet_v2_s", "convnext_tiny", "regnet_y_400mf", "densenet121", "swin_t", "fpn backbone", "googlenet",
    "vgg11",
]  # fmt: skip


@pytest.mark.parametrize("name", TORCHVISION if ALL else TORCHVISION_IN_CI)
def test_torchvision_architectures(name: str) -> None:
    torch.manual_seed(0)
    model = _torchvision(name)().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # statistics far from the identity, so a wrong fold shows
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.running_mean, -0.1, 0.1)
    x = torch.randn(2, 3, 64, 64)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x)
    # Swin-T's attention is a function torchvision wraps for tracing, on the model's parameters: torch.export traces
    # through it where this torch has it.
    through_export = name == "swin_t" and HAS_EXPORT_AUTO
    assert graph_forward(optimized).path == ("torch.export" if through_export else "torch.fx symbolic trace")
    with torch.no_grad():
        got, expected = optimized(x), model(x)
    if isinstance(expected, dict):  # the FPN's feature maps
        got, expected = list(got.values()), list(expected.values())
    for g, e in zip(got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * float(e.abs().max()))


def test_convnext_in_bf16_on_every_torch() -> None:
    """ConvNeXt's LayerNorms take a bf16 activation beside fp32 weights, which torch 1.13 refuses: graph mode runs
    them on ember's norm kernel, so the graph is used there too (the capture is checked in fp32 where the model's
    own forward cannot run under autocast)."""
    torch.manual_seed(0)
    model = _torchvision("convnext_tiny")().eval()
    x = torch.randn(2, 3, 64, 64)
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=x)
    assert graph_forward(optimized).path == "torch.fx symbolic trace"
    with torch.no_grad():
        got, expected = optimized(x), model(x)
    assert got.dtype == torch.bfloat16
    # bf16 matmuls over 18 blocks: the error autocast's own bf16 run shows on this model is of the same size
    torch.testing.assert_close(got.float(), expected, rtol=0.0, atol=2e-2 * float(expected.abs().max()))


@pytest.mark.skipif(torch.__version__ < "2", reason="torch 1.13's symbolic trace cannot unpack the attention's result")
def test_torchvision_vit_writes_its_attention_out_and_replays_each_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's ViT calls nn.MultiheadAttention as one module: graph mode writes the call out, so each encoder
    block's projections, attention and MLP (the residual adds in their epilogues) replay as one segment."""
    torchvision = pytest.importorskip("torchvision")
    # (small fp32 Linears go to MKL's matmul on Intel CPUs, calls a segment cannot replay: test_replay.py's fixture)
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: False)
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128).eval()
    x = torch.randn(2, 3, 32, 32)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x)
    forward = graph_forward(optimized)
    assert forward.path == "torch.fx symbolic trace"
    segments = [m for m in forward.graph.modules() if isinstance(m, ReplaySegment)]
    # each block: its two norms, the input projection, the attention, the output projection, the MLP's two Linears;
    # the last block's segment goes on into the final norm and the classifier (reading each sequence's first token)
    assert [len(s.kernels) for s in segments] == [7, 9]
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):
            torch.testing.assert_close(optimized(x), expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    assert all(s.replays == 1 for s in segments), [s.refused for s in segments]


def test_a_bf16_vit_with_a_sample_input_captures_on_every_torch() -> None:
    """The capture runs the model on sample_input under autocast (to check what it captured, and on torch 1.13 to
    record each part's inputs): torch 1.13's fused self-attention fails there ("expected scalar type BFloat16"), so
    the attention modules go down their composite path before any capture runs them."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128).eval()
    nn.init.normal_(model.heads.head.weight)  # (zero at construction: every output would be the bias)
    x = torch.randn(2, 3, 32, 32)
    optimized = ember.optimize(model, dtype=torch.bfloat16, sample_input=x)
    with torch.no_grad():
        got, expected = optimized(x), model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.0, atol=2e-2 * float(expected.abs().max()))
