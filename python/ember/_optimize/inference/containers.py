"""Fusion inside known containers whose forward is not a Sequential's: torchvision's ResNet (stem, BasicBlock,
Bottleneck) and SqueezeExcitation, the feed-forward and output blocks of Hugging Face's BERT and RoBERTa, the MLP
of its ViT, and the convolution layers and residual blocks of its ResNet.

Each gets a forward installed on the instance that computes exactly what the class's forward computes, with each
convolution or Linear running as one oneDNN call with its BatchNorm folded in and what follows it (ReLU, GELU, the
residual add) as post-ops. The installed forward is only taken for the exact classes named here (a subclass may
have changed the forward), in eval mode without autograd; otherwise the class's own forward runs. A fused call the
kernel does not take runs as its modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ember._optimize.inference.common import fast_path_allowed, foldable_batchnorm, hooks_would_be_skipped
from ember._optimize.inference.conv import ConvForward
from ember._optimize.inference.linear import LinearForward
from ember._optimize.inference.sequential import activation_name


def _is(module: nn.Module, module_prefix: str, *names: str) -> bool:
    kind = type(module)
    return kind.__name__ in names and kind.__module__.startswith(module_prefix)


# An activation module and its post-op name ("relu", ...).
Activation = tuple[nn.Module, str]


class Children:
    """The named children of a container that its fused forward was planned on. The forward runs fused only while
    they are still the container's children and none has a forward hook: one replaced after optimizing
    (``block.conv1 = other``) sends calls to the class's own forward, as a changed nn.Sequential does
    (sequential.py), and so does a hook, which the fused call would skip. Reads the module registry directly: this
    runs on every call, where nn.Module.__getattr__ costs 1-2 us per name."""

    __slots__ = ("module", "modules", "planned")

    def __init__(self, module: nn.Module, names: Sequence[str]) -> None:
        self.module = module
        self.planned = tuple((name, module._modules.get(name)) for name in names)
        self.modules = tuple(child for _, child in self.planned if child is not None)

    def intact(self) -> bool:
        registry = self.module._modules
        for name, child in self.planned:
            if registry.get(name) is not child:
                return False
        return not hooks_would_be_skipped(self.modules)


@dataclass
class ConvBn:
    """A convolution with its BatchNorm folded in, then optionally a residual add and an activation."""

    conv: nn.Module
    bn: nn.Module

    def run(self, x: torch.Tensor, activation: Activation | None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``activation(bn(conv(x)) [+ residual])``: one call where the kernel takes it, else the modules."""
        if activation is None:
            epilogue: tuple[str, ...] = () if residual is None else ("add",)
        else:
            epilogue = (activation[1],) if residual is None else ("add", activation[1])
        out = self.conv.forward.fused(x, epilogue, residual)
        if out is None:  # the kernel does not take this input: the modules, as the container runs them
            out = self.bn(self.conv(x))
            if residual is not None:
                out = out + residual
            if activation is not None:
                out = activation[0](out)
        return out


def _conv_bn(conv: nn.Module, bn: nn.Module) -> ConvBn | None:
    """The pair, with the BatchNorm handed to the convolution's kernel, when ember can fold it."""
    forward = conv.__dict__.get("forward")
    if not isinstance(forward, ConvForward) or forward.state.bn is not None or forward.geometry.transposed:
        return None
    if not foldable_batchnorm(bn, conv.out_channels, (nn.BatchNorm2d,)):
        return None
    return ConvBn(conv, bn)


def _claim(pairs: list[ConvBn]) -> None:
    for pair in pairs:
        pair.conv.forward.state.bn = pair.bn


class ResNetBlockForward:
    """torchvision's BasicBlock / Bottleneck: conv-bn-relu steps, the last adding the identity before its ReLU."""

    _ember_forward = True

    def __init__(self, block: nn.Module, steps: list[ConvBn], names: list[str]) -> None:
        self.block = block
        self.steps = steps
        self.modules = [block] + [m for s in steps for m in (s.conv, s.bn)]
        self.children = Children(block, [*names, "relu", "downsample"])
        self.relu = (block.relu, "relu")
        self.downsample = block.downsample

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        block = self.block
        if not self.children.intact() or not fast_path_allowed(self.modules, x):
            return type(block).forward(block, x)
        identity = self.downsample(x) if self.downsample is not None else x
        out = x
        for step in self.steps[:-1]:
            out = step.run(out, self.relu)
        return self.steps[-1].run(out, self.relu, identity)

    def __repr__(self) -> str:
        return f"ResNetBlockForward({type(self.block).__name__}, {len(self.steps)} fused convolution(s))"


class ResNetForward:
    """torchvision's ResNet: the stem's conv-bn-relu fused, the rest as torchvision's ``_forward_impl``."""

    _ember_forward = True

    def __init__(self, model: nn.Module, stem: ConvBn) -> None:
        self.model = model
        self.stem = stem
        self.children = Children(model, ["conv1", "bn1", "relu"])
        self.relu = (model.relu, "relu")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        if not self.children.intact() or not fast_path_allowed((m, self.stem.conv, self.stem.bn), x):
            return type(m).forward(m, x)
        x = self.stem.run(x, self.relu)
        x = m.maxpool(x)
        x = m.layer4(m.layer3(m.layer2(m.layer1(x))))
        x = torch.flatten(m.avgpool(x), 1)
        return m.fc(x)

    def __repr__(self) -> str:
        return "ResNetForward(stem fused)"


def _resnet_block(block: nn.Module) -> ResNetBlockForward | None:
    names = ["1", "2", "3"] if _is(block, "torchvision.", "Bottleneck") else ["1", "2"]
    if type(getattr(block, "relu", None)) is not nn.ReLU:
        return None
    steps = [_conv_bn(getattr(block, f"conv{n}", None), getattr(block, f"bn{n}", None)) for n in names]
    if any(s is None for s in steps):
        return None
    _claim(steps)
    return ResNetBlockForward(block, steps, [f"{kind}{n}" for n in names for kind in ("conv", "bn")])


def _resnet(model: nn.Module) -> ResNetForward | None:
    if type(getattr(model, "relu", None)) is not nn.ReLU:
        return None
    stem = _conv_bn(model.conv1, model.bn1)
    if stem is None:
        return None
    _claim([stem])
    return ResNetForward(model, stem)


class SqueezeExcitationForward:
    """torchvision's SqueezeExcitation (MobileNetV3, EfficientNet): ``x * sigma(fc2(delta(fc1(avgpool(x)))))``, each
    1x1 convolution one call with its activation a post-op."""

    _ember_forward = True

    def __init__(self, module: nn.Module, delta: str, sigma: str) -> None:
        self.module = module
        self.epilogues = ((delta,), (sigma,))
        self.children = Children(module, ["avgpool", "fc1", "fc2", "activation", "scale_activation"])
        self.modules = (module, module.fc1, module.fc2)
        self.avgpool = module.avgpool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.children.intact() and fast_path_allowed(self.modules, x):
            _, fc1, fc2 = self.modules
            scale = fc1.forward.fused(self.avgpool(x), self.epilogues[0])
            scale = fc2.forward.fused(scale, self.epilogues[1]) if scale is not None else None
            if scale is not None:
                return scale * x
        return type(m).forward(m, x)

    def __repr__(self) -> str:
        return f"SqueezeExcitationForward({self.epilogues[0][0]}, {self.epilogues[1][0]})"


def _squeeze_excitation(module: nn.Module) -> SqueezeExcitationForward | None:
    delta, sigma = activation_name(module.activation), activation_name(module.scale_activation)
    convs = [module.fc1.__dict__.get("forward"), module.fc2.__dict__.get("forward")]
    if delta is None or sigma is None or not all(isinstance(f, ConvForward) and f.state.bn is None for f in convs):
        return None
    return SqueezeExcitationForward(module, delta, sigma)


# Hugging Face transformers ----------------------------------------------------------------------------------------


def _hf_activation(act: Callable) -> str | None:
    """The epilogue name of a Hugging Face activation module (GELUActivation and friends) or a torch one."""
    if isinstance(act, nn.Module) and activation_name(act) is not None:
        return activation_name(act)
    inner = getattr(act, "act", None)  # GELUActivation keeps the function it calls
    if type(act).__name__ == "GELUActivation" and inner is F.gelu:
        return "gelu"
    return None


class LinearActivationForward:
    """``act(linear(h))``, then ``after`` when named, with the activation a post-op of the Linear:
    BertIntermediate and RobertaIntermediate (dense), Hugging Face's ViTMLP (fc1, then fc2)."""

    _ember_forward = True

    def __init__(
        self, module: nn.Module, linear: str, activation_attr: str, activation: str, after: str | None = None
    ) -> None:
        self.module = module
        self.epilogue = (activation,)
        self.children = Children(module, [linear, activation_attr] + ([after] if after else []))
        self.modules = (module, getattr(module, linear))
        self.after = getattr(module, after) if after else None

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.children.intact() and fast_path_allowed(self.modules, hidden_states):
            out = self.modules[1].forward.fused(hidden_states, self.epilogue)
            if out is not None:
                return self.after(out) if self.after is not None else out
        return type(m).forward(m, hidden_states)

    def __repr__(self) -> str:
        linear = self.children.planned[0][0]
        return f"LinearActivationForward({type(self.module).__name__}, {linear} + {self.epilogue[0]})"


class ResidualOutputForward:
    """``LayerNorm(dropout(dense(h)) + input)``: BertSelfOutput, BertOutput and RoBERTa's, with eval-mode dropout
    the identity and the add a post-op."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.children = Children(module, ["dense", "dropout", "LayerNorm"])
        self.modules = (module, module.dense, module.dropout)
        self.layer_norm = module.LayerNorm

    def __call__(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.children.intact() and fast_path_allowed(self.modules, hidden_states) and not input_tensor.requires_grad:
            out = self.modules[1].forward.fused(hidden_states, ("add",), input_tensor)
            if out is not None:
                return self.layer_norm(out)
        return type(m).forward(m, hidden_states, input_tensor)

    def __repr__(self) -> str:
        return f"ResidualOutputForward({type(self.module).__name__})"


class ConvLayerForward:
    """Hugging Face ResNet's ResNetConvLayer (convolution, normalization, activation) and ResNetShortCut
    (convolution, normalization): one call, the BatchNorm folded in and the activation a post-op."""

    _ember_forward = True

    def __init__(self, module: nn.Module, pair: ConvBn, activation: Activation | None) -> None:
        self.module = module
        self.pair = pair
        self.activation = activation
        self.modules = (module, pair.conv, pair.bn)
        self.children = Children(module, ["convolution", "normalization", "activation"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.children.intact() or not fast_path_allowed(self.modules, x):
            return type(self.module).forward(self.module, x)
        return self.pair.run(x, self.activation)

    def __repr__(self) -> str:
        activation = self.activation[1] if self.activation is not None else "no activation"
        return f"ConvLayerForward({type(self.module).__name__}, {activation})"


class ResidualLayerForward:
    """Hugging Face ResNet's ResNetBasicLayer / ResNetBottleNeckLayer: ``act(layer(x) + shortcut(x))``, the add
    and the activation post-ops of the last convolution layer."""

    _ember_forward = True

    def __init__(self, module: nn.Module, activation: str) -> None:
        self.module = module
        self.then = (module.activation, activation)
        self.layers = list(module.layer)
        self.last = self.layers[-1].forward
        self.shortcut = module.shortcut
        self.modules = (module, module.layer, *self.last.modules)
        self.children = Children(module, ["shortcut", "layer", "activation"])

    def intact(self) -> bool:
        """The planned children, in the layer stack too, down to the last convolution layer's."""
        return self.children.intact() and list(self.module.layer) == self.layers and self.last.children.intact()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if not self.intact() or not fast_path_allowed(self.modules, x):
            return type(m).forward(m, x)
        residual = self.shortcut(x)
        out = x
        for layer in self.layers[:-1]:
            out = layer(out)
        return self.last.pair.run(out, self.then, residual)  # its own activation is None

    def __repr__(self) -> str:
        return f"ResidualLayerForward({type(self.module).__name__}, add + {self.then[1]})"


_HF_RESNET = "transformers.models.resnet."
_HF_RESNET_LAYERS = ("ResNetConvLayer", "ResNetShortCut", "ResNetBasicLayer", "ResNetBottleNeckLayer")


def _hf_resnet(module: nn.Module) -> object | None:
    if _is(module, _HF_RESNET, "ResNetConvLayer", "ResNetShortCut"):
        act = getattr(module, "activation", None)
        activation = None if act is None or isinstance(act, nn.Identity) else (act, _hf_activation(act))
        pair = _conv_bn(module.convolution, module.normalization)
        if (activation is not None and activation[1] is None) or pair is None:
            return None
        _claim([pair])
        return ConvLayerForward(module, pair, activation)
    if _is(module, _HF_RESNET, "ResNetBasicLayer", "ResNetBottleNeckLayer"):
        activation = _hf_activation(module.activation)
        last = module.layer[-1].__dict__.get("forward") if len(module.layer) else None
        if activation is None or not isinstance(last, ConvLayerForward) or last.activation is not None:
            return None
        return ResidualLayerForward(module, activation)
    return None


def _linear_ready(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return isinstance(forward, LinearForward) and forward.state.bn is None


def _hf_container(module: nn.Module) -> object | None:
    if _is(module, "transformers.", "BertIntermediate", "RobertaIntermediate"):
        activation = _hf_activation(module.intermediate_act_fn)
        if activation is not None and _linear_ready(module.dense):
            return LinearActivationForward(module, "dense", "intermediate_act_fn", activation)
    elif _is(
        module, "transformers.", "BertSelfOutput", "BertOutput", "RobertaSelfOutput", "RobertaOutput"
    ) and _linear_ready(module.dense):
        return ResidualOutputForward(module)
    elif _is(module, "transformers.", "ViTMLP"):
        activation = _hf_activation(module.activation_fn)
        if activation is not None and _linear_ready(module.fc1):
            return LinearActivationForward(module, "fc1", "activation_fn", activation, after="fc2")
    return None


def fuse_known_containers(model: nn.Module, conv_bn_folding: bool) -> list[str]:
    """Installs the forwards above on every known container of ``model``; returns the class name of each. Inner
    containers come first (a residual layer builds on the forward of its last convolution layer)."""
    done: list[str] = []
    for module in reversed(list(model.modules())):
        if "forward" in module.__dict__:
            continue
        forward: object | None = None
        if conv_bn_folding and _is(module, "torchvision.", "BasicBlock", "Bottleneck"):
            forward = _resnet_block(module)
        elif conv_bn_folding and _is(module, "torchvision.", "ResNet"):
            forward = _resnet(module)
        elif _is(module, "torchvision.", "SqueezeExcitation"):
            forward = _squeeze_excitation(module)
        elif conv_bn_folding and _is(module, _HF_RESNET, *_HF_RESNET_LAYERS):
            forward = _hf_resnet(module)
        else:
            forward = _hf_container(module)
        if forward is not None:
            module.__dict__["forward"] = forward
            done.append(type(module).__name__)
    return done[::-1]  # in the model's order
