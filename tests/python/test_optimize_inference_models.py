"""ember.optimize for inference on architectures the project did not write: torchvision's ResNet-50, MobileNetV3
and ViT-B/16 (where torchvision imports: Debian's, beside torch 1.13), Hugging Face transformers' BERT, ViT,
ResNet and GPT-2 built from configs with random weights (where transformers imports), and
torch.nn.TransformerEncoder. Outputs against stock PyTorch at batch 1 and a larger batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ember
from ember import _C

BF16 = _C.Linear.supported("bfloat16") and _C.Convolution.supported("bfloat16")


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest elementwise error relative to the output's largest magnitude."""
    out, expected = out.float(), expected.float()
    return float((out - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def randomize(model: nn.Module) -> nn.Module:
    """Random BatchNorm statistics and random values for zero-initialized weights (torchvision's ViT head and
    residual-branch BatchNorms start at zero), so every layer shows in the output."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            elif isinstance(m, nn.Linear) and not m.weight.any():
                m.weight.normal_(0, 0.02, generator=g)
    return model.eval()


def check(model: nn.Module, inputs: list, fp32_tol: float = 1e-5, bf16_tol: float = 5e-2, call=None) -> None:
    """fp32: ~1e-5 of the output's scale (only the order of fp32 additions differs). bf16 against torch's
    autocast: both round weights and activations to 8 mantissa bits per layer and accumulate in fp32, at slightly
    different places (ember folds BatchNorm before rounding, applies post-ops before rounding the output), so the
    two drift apart by a few 2^-8 per layer; through a deep network that is a few percent of the output's scale."""
    call = call or (lambda m, x: m(x))
    optimized = ember.optimize(model)
    with torch.no_grad():
        for x in inputs:
            assert relative_error(call(optimized, x), call(model, x)) < fp32_tol
    if not BF16:
        return
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    with torch.no_grad():
        for x in inputs:
            # Grad mode keeps torch 1.13's fused TransformerEncoder / MultiheadAttention fast path out of the
            # reference: it fails under bf16 autocast ("expected scalar type BFloat16 but found Float").
            with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                expected = call(model, x).detach()
            assert relative_error(call(optimized, x), expected) < bf16_tol


def images(size: int = 224) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(1, 3, size, size), torch.randn(3, 3, size, size)]


def calls_into(modules: list[nn.Module], run) -> int:
    """How many times the modules' forwards ran during ``run()``: zero where ember fused them away. Counted by a
    wrapper of each module's forward, not a forward hook: a hook turns fusion off (the fused call would skip it)."""
    calls = [0]
    installed = {id(m): m.__dict__.get("forward") for m in modules}

    def counting(inner):
        def forward(*args, **kwargs):
            calls[0] += 1
            return inner(*args, **kwargs)

        return forward

    for m in modules:
        m.__dict__["forward"] = counting(m.forward)
    try:
        run()
    finally:
        for m in modules:
            if installed[id(m)] is None:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = installed[id(m)]
    return calls[0]


# torchvision --------------------------------------------------------------------------------------------------------


def _torchvision():
    try:
        import torchvision
    except Exception:
        pytest.skip("torchvision does not import beside this torch")
    return torchvision


def test_torchvision_resnet50(capsys) -> None:
    tv = _torchvision()
    model = randomize(tv.models.resnet50())
    optimized = ember.optimize(model, report=True)
    report = capsys.readouterr().out
    assert "53 convolution(s)" in report and "16 Bottleneck" in report and "1 ResNet" in report
    assert sum(1 for m in optimized.modules() if getattr(m.__dict__.get("forward"), "state", None)) == 54
    check(model, images(), bf16_tol=8e-2)


def replace_children(model: nn.Module, names: list[str]) -> nn.Module:
    """``model`` with each named child (dotted path) replaced by a fresh copy of it with new random weights, the
    way a user swaps a layer after optimizing."""
    import copy

    g = torch.Generator().manual_seed(7)
    for name in names:
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        child = copy.deepcopy(parent.get_submodule(child_name))
        child.__dict__.pop("forward", None)  # a plain module, as the user built it
        with torch.no_grad():
            for p in child.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * p.std().clamp_min(0.05))
        setattr(parent, child_name, child)
    return model


def check_replaced_children(model: nn.Module, names: list[str], inputs: list, call=None) -> None:
    """A known container whose children were replaced after optimizing computes with the new children (its fused
    forward gives way to the class's), as the stock model with the same replacements does."""
    import copy

    call = call or (lambda m, x: m(x))
    optimized = ember.optimize(model)
    with torch.no_grad():
        call(optimized, inputs[0])  # plans and kernels made for the original children
    expected = replace_children(copy.deepcopy(model), names)
    replace_children(optimized, names)
    with torch.no_grad():
        for x in inputs:
            assert relative_error(call(optimized, x), call(expected, x)) < 1e-5


def test_torchvision_resnet_with_replaced_children() -> None:
    tv = _torchvision()
    model = randomize(tv.models.resnet18())
    check_replaced_children(model, ["conv1", "layer1.0.conv2", "layer2.0.bn1", "layer3.0.downsample"], images(64))


def test_torchvision_mobilenet_v3(capsys) -> None:
    tv = _torchvision()
    model = randomize(tv.models.mobilenet_v3_large())
    optimized = ember.optimize(model, report=True)
    assert "8 SqueezeExcitation" in capsys.readouterr().out
    # Each squeeze-excitation's two 1x1 convolutions run with their ReLU and Hardsigmoid as post-ops.
    blocks = [m for m in optimized.modules() if type(m).__name__ == "SqueezeExcitation"]
    activations = [a for m in blocks for a in (m.activation, m.scale_activation)]
    with torch.no_grad():
        assert calls_into(activations, lambda: optimized(images()[0])) == 0
    check(model, images())


def test_torchvision_vit_b16() -> None:
    tv = _torchvision()
    torch.manual_seed(0)
    model = randomize(tv.models.vit_b_16())
    check(model, [torch.randn(1, 3, 224, 224), torch.randn(2, 3, 224, 224)], fp32_tol=5e-5)


# Hugging Face transformers ----------------------------------------------------------------------------------------


def _transformers():
    return pytest.importorskip("transformers")


def _hidden(model: nn.Module, inputs: dict) -> torch.Tensor:
    return model(**inputs).last_hidden_state


def test_hf_bert(capsys) -> None:
    T = _transformers()
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
    model = T.BertModel(config).eval()
    ember.optimize(model, report=True)
    assert "2 BertIntermediate, 2 BertOutput" in capsys.readouterr().out.replace("2 BertSelfOutput, ", "")
    batches = [{"input_ids": torch.randint(0, 1000, (b, 24))} for b in (1, 4)]
    check(model, batches, fp32_tol=2e-5, call=_hidden)


def test_hf_bert_with_replaced_children() -> None:
    T = _transformers()
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    model = T.BertModel(config).eval()
    names = ["encoder.layer.0.output.dense", "encoder.layer.1.intermediate.dense", "encoder.layer.1.output.LayerNorm"]
    check_replaced_children(model, names, [{"input_ids": torch.randint(0, 1000, (2, 12))}], call=_hidden)


def test_hf_vit(capsys) -> None:
    T = _transformers()
    torch.manual_seed(0)
    config = T.ViTConfig(
        hidden_size=96, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=64, patch_size=8
    )
    model = T.ViTModel(config).eval()
    optimized = ember.optimize(model, report=True)
    if hasattr(T.models.vit.modeling_vit, "ViTMLP"):  # transformers 5's ViT; 4's has ViTIntermediate/ViTOutput
        assert "2 ViTMLP" in capsys.readouterr().out
        activations = [m.activation_fn for m in optimized.modules() if type(m).__name__ == "ViTMLP"]
        with torch.no_grad():
            assert calls_into(activations, lambda: optimized(pixel_values=images(64)[0])) == 0  # post-ops of fc1
    check(model, [{"pixel_values": x} for x in images(64)], fp32_tol=2e-5, call=_hidden)


@pytest.mark.parametrize("layer_type", ["bottleneck", "basic"])
def test_hf_resnet(layer_type: str, capsys) -> None:
    T = _transformers()
    torch.manual_seed(0)
    config = T.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128], depths=[1, 2, 1], layer_type=layer_type)
    model = randomize(T.ResNetModel(config))
    optimized = ember.optimize(model, report=True)
    layer = "ResNetBottleNeckLayer" if layer_type == "bottleneck" else "ResNetBasicLayer"
    assert f"4 {layer}, 2 ResNetShortCut" in capsys.readouterr().out
    # Every BatchNorm folded into its convolution, every activation and residual add a post-op.
    folded = [m for m in optimized.modules() if isinstance(m, (nn.BatchNorm2d, nn.ReLU))]
    with torch.no_grad():
        assert calls_into(folded, lambda: optimized(pixel_values=images(96)[1])) == 0
    check(model, [{"pixel_values": x} for x in images(96)], call=_hidden)


def test_hf_resnet_with_replaced_children() -> None:
    T = _transformers()
    torch.manual_seed(0)
    config = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck")
    model = randomize(T.ResNetModel(config))
    names = [
        "encoder.stages.0.layers.0.layer.2.convolution",
        "encoder.stages.1.layers.0.shortcut.normalization",
        "encoder.stages.1.layers.0.layer.2",
    ]
    check_replaced_children(model, names, [{"pixel_values": images(64)[1]}], call=_hidden)


def test_hf_gpt2() -> None:
    T = _transformers()
    torch.manual_seed(0)
    model = T.GPT2Model(T.GPT2Config(n_embd=96, n_layer=2, n_head=4)).eval()
    batches = [{"input_ids": torch.randint(0, 1000, (b, 20))} for b in (1, 3)]
    check(model, batches, fp32_tol=2e-5, call=_hidden)


# torch.nn ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 8])
def test_transformer_encoder(batch: int) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, batch_first=True)
    model = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    check(model, [torch.randn(batch, 16, 64)], fp32_tol=2e-5, bf16_tol=1e-1)
