"""torchvision's containers fused: ResNet (stem, BasicBlock, Bottleneck) and SqueezeExcitation (MobileNetV3,
EfficientNet). See containers.py for the rules every fused container forward follows."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember._optimize.inference.common import class_forward, fast_path_allowed
from ember._optimize.inference.container_parts import (
    Activation,
    Children,
    ConvBn,
    child_of,
    claim,
    conv_bn,
    installed_forward,
    is_class,
)
from ember._optimize.inference.conv import ConvForward
from ember._optimize.inference.sequential import activation_name


class ResNetBlockForward:
    """torchvision's BasicBlock / Bottleneck: conv-bn-relu steps, the last adding the identity before its ReLU."""

    _ember_forward = True

    def __init__(self, block: nn.Module, steps: list[ConvBn], names: list[str], relu: nn.Module) -> None:
        self.block = block
        self.steps = steps
        self.modules = [block] + [m for s in steps for m in (s.conv, s.bn)]
        self.children = Children(block, [*names, "relu", "downsample"])
        self.relu: Activation = (relu, "relu")
        self.downsample = child_of(block, "downsample")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        block = self.block
        if not self.children.intact() or not fast_path_allowed(self.modules, x):
            return class_forward(block, x)
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

    def __init__(self, model: nn.Module, stem: ConvBn, relu: nn.Module) -> None:
        self.model = model
        self.stem = stem
        self.children = Children(model, ["conv1", "bn1", "relu"])
        self.relu: Activation = (relu, "relu")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        if not self.children.intact() or not fast_path_allowed((m, self.stem.conv, self.stem.bn), x):
            return class_forward(m, x)
        x = self.stem.run(x, self.relu)
        # torchvision's _forward_impl after the stem, reading each child as it does (one replaced since is used).
        net: Any = m
        x = net.maxpool(x)
        x = net.layer4(net.layer3(net.layer2(net.layer1(x))))
        x = torch.flatten(net.avgpool(x), 1)
        logits: torch.Tensor = net.fc(x)
        return logits

    def __repr__(self) -> str:
        return "ResNetForward(stem fused)"


def _relu(module: nn.Module) -> nn.Module | None:
    relu = child_of(module, "relu")
    return relu if type(relu) is nn.ReLU else None


def resnet_block(block: nn.Module) -> ResNetBlockForward | None:
    names = ["1", "2", "3"] if is_class(block, "torchvision.", "Bottleneck") else ["1", "2"]
    relu = _relu(block)
    if relu is None:
        return None
    steps = [conv_bn(child_of(block, f"conv{n}"), child_of(block, f"bn{n}")) for n in names]
    pairs = [s for s in steps if s is not None]
    if len(pairs) != len(steps):
        return None
    claim(pairs)
    return ResNetBlockForward(block, pairs, [f"{kind}{n}" for n in names for kind in ("conv", "bn")], relu)


def resnet(model: nn.Module) -> ResNetForward | None:
    relu = _relu(model)
    stem = conv_bn(child_of(model, "conv1"), child_of(model, "bn1"))
    if relu is None or stem is None:
        return None
    claim([stem])
    return ResNetForward(model, stem, relu)


class SqueezeExcitationForward:
    """torchvision's SqueezeExcitation (MobileNetV3, EfficientNet): ``x * sigma(fc2(delta(fc1(avgpool(x)))))``, each
    1x1 convolution one call with its activation a post-op."""

    _ember_forward = True

    def __init__(self, module: nn.Module, fc1: ConvForward, fc2: ConvForward, delta: str, sigma: str) -> None:
        self.module = module
        self.fc1, self.fc2 = fc1, fc2
        self.epilogues = ((delta,), (sigma,))
        self.children = Children(module, ["avgpool", "fc1", "fc2", "activation", "scale_activation"])
        self.modules = (module, fc1.module, fc2.module)
        self.avgpool = child_of(module, "avgpool")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.avgpool is not None and self.children.intact() and fast_path_allowed(self.modules, x):
            scale = self.fc1.fused(self.avgpool(x), self.epilogues[0])
            scale = self.fc2.fused(scale, self.epilogues[1]) if scale is not None else None
            if scale is not None:
                return scale * x
        return class_forward(m, x)

    def __repr__(self) -> str:
        return f"SqueezeExcitationForward({self.epilogues[0][0]}, {self.epilogues[1][0]})"


def squeeze_excitation(module: nn.Module) -> SqueezeExcitationForward | None:
    activation, scale_activation = child_of(module, "activation"), child_of(module, "scale_activation")
    delta = activation_name(activation) if activation is not None else None
    sigma = activation_name(scale_activation) if scale_activation is not None else None
    fc1, fc2 = installed_forward(child_of(module, "fc1")), installed_forward(child_of(module, "fc2"))
    if delta is None or sigma is None or child_of(module, "avgpool") is None:
        return None
    if not isinstance(fc1, ConvForward) or not isinstance(fc2, ConvForward):
        return None
    if fc1.state.bn is not None or fc2.state.bn is not None:
        return None
    return SqueezeExcitationForward(module, fc1, fc2, delta, sigma)
