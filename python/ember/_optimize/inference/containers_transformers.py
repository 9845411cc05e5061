"""Hugging Face transformers' containers fused: the feed-forward and output blocks of BERT and RoBERTa, the MLP of
ViT, and ResNet's convolution layers and residual blocks. See containers.py for the rules every fused container
forward follows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
    linear_forward,
)
from ember._optimize.inference.linear import LinearForward
from ember._optimize.inference.sequential import activation_name


def _activation_name(act: object) -> str | None:
    """The epilogue name of a Hugging Face activation module (GELUActivation and friends) or a torch one."""
    if isinstance(act, nn.Module) and (name := activation_name(act)) is not None:
        return name
    inner = getattr(act, "act", None)  # GELUActivation keeps the function it calls
    if type(act).__name__ == "GELUActivation" and inner is F.gelu:
        return "gelu"
    return None


class LinearActivationForward:
    """``act(linear(h))``, then ``after`` when named, with the activation a post-op of the Linear:
    BertIntermediate and RobertaIntermediate (dense), Hugging Face's ViTMLP (fc1, then fc2)."""

    _ember_forward = True

    def __init__(
        self,
        module: nn.Module,
        linear: LinearForward,
        names: tuple[str, str],
        activation: str,
        after: tuple[str, nn.Module] | None = None,
    ) -> None:
        self.module = module
        self.linear = linear
        self.epilogue = (activation,)
        self.children = Children(module, [*names] + ([after[0]] if after else []))
        self.modules = (module, linear.module)
        self.after = after[1] if after else None

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.children.intact() and fast_path_allowed(self.modules, hidden_states):
            out = self.linear.fused(hidden_states, self.epilogue)
            if out is not None:
                return self.after(out) if self.after is not None else out
        return class_forward(m, hidden_states)

    def __repr__(self) -> str:
        linear = self.children.planned[0][0]
        return f"LinearActivationForward({type(self.module).__name__}, {linear} + {self.epilogue[0]})"


class ResidualOutputForward:
    """``LayerNorm(dropout(dense(h)) + input)``: BertSelfOutput, BertOutput and RoBERTa's, with eval-mode dropout
    the identity and the add a post-op."""

    _ember_forward = True

    def __init__(self, module: nn.Module, dense: LinearForward, dropout: nn.Module, layer_norm: nn.Module) -> None:
        self.module = module
        self.dense = dense
        self.children = Children(module, ["dense", "dropout", "LayerNorm"])
        self.modules = (module, dense.module, dropout)
        self.layer_norm = layer_norm

    def __call__(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        m = self.module
        if self.children.intact() and fast_path_allowed(self.modules, hidden_states) and not input_tensor.requires_grad:
            out = self.dense.fused(hidden_states, ("add",), input_tensor)
            if out is not None:
                normed: torch.Tensor = self.layer_norm(out)
                return normed
        return class_forward(m, hidden_states, input_tensor)

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
            return class_forward(self.module, x)
        return self.pair.run(x, self.activation)

    def __repr__(self) -> str:
        activation = self.activation[1] if self.activation is not None else "no activation"
        return f"ConvLayerForward({type(self.module).__name__}, {activation})"


class ResidualLayerForward:
    """Hugging Face ResNet's ResNetBasicLayer / ResNetBottleNeckLayer: ``act(layer(x) + shortcut(x))``, the add
    and the activation post-ops of the last convolution layer."""

    _ember_forward = True

    def __init__(
        self, module: nn.Module, layer: nn.Sequential, last: ConvLayerForward, shortcut: nn.Module, then: Activation
    ) -> None:
        self.module = module
        self.then = then
        self.layer = layer
        self.layers = list(layer)
        self.last = last
        self.shortcut = shortcut
        self.modules = (module, layer, *last.modules)
        self.children = Children(module, ["shortcut", "layer", "activation"])

    def intact(self) -> bool:
        """The planned children, in the layer stack too, down to the last convolution layer's."""
        return self.children.intact() and list(self.layer) == self.layers and self.last.children.intact()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if not self.intact() or not fast_path_allowed(self.modules, x):
            return class_forward(m, x)
        residual = self.shortcut(x)
        out = x
        for layer in self.layers[:-1]:
            out = layer(out)
        return self.last.pair.run(out, self.then, residual)  # its own activation is None

    def __repr__(self) -> str:
        return f"ResidualLayerForward({type(self.module).__name__}, add + {self.then[1]})"


RESNET = "transformers.models.resnet."
RESNET_LAYERS = ("ResNetConvLayer", "ResNetShortCut", "ResNetBasicLayer", "ResNetBottleNeckLayer")


def resnet_layer(module: nn.Module) -> ConvLayerForward | ResidualLayerForward | None:
    """The fused forward of one of Hugging Face ResNet's RESNET_LAYERS, or None."""
    act = child_of(module, "activation")
    if is_class(module, RESNET, "ResNetConvLayer", "ResNetShortCut"):
        activation: Activation | None = None
        if act is not None and not isinstance(act, nn.Identity):
            name = _activation_name(act)
            if name is None:
                return None
            activation = (act, name)
        pair = conv_bn(child_of(module, "convolution"), child_of(module, "normalization"))
        if pair is None:
            return None
        claim([pair])
        return ConvLayerForward(module, pair, activation)
    if is_class(module, RESNET, "ResNetBasicLayer", "ResNetBottleNeckLayer"):
        name = _activation_name(act)
        layer, shortcut = child_of(module, "layer"), child_of(module, "shortcut")
        if act is None or name is None or not isinstance(layer, nn.Sequential) or shortcut is None or not len(layer):
            return None
        last = installed_forward(layer[-1])
        if not isinstance(last, ConvLayerForward) or last.activation is not None:
            return None
        return ResidualLayerForward(module, layer, last, shortcut, (act, name))
    return None


def block(module: nn.Module) -> LinearActivationForward | ResidualOutputForward | None:
    """The fused forward of a BERT, RoBERTa or ViT block, or None."""
    if is_class(module, "transformers.", "BertIntermediate", "RobertaIntermediate"):
        activation = _activation_name(child_of(module, "intermediate_act_fn"))
        dense = linear_forward(child_of(module, "dense"))
        if activation is not None and dense is not None:
            return LinearActivationForward(module, dense, ("dense", "intermediate_act_fn"), activation)
    elif is_class(module, "transformers.", "BertSelfOutput", "BertOutput", "RobertaSelfOutput", "RobertaOutput"):
        dense = linear_forward(child_of(module, "dense"))
        dropout, layer_norm = child_of(module, "dropout"), child_of(module, "LayerNorm")
        if dense is not None and dropout is not None and layer_norm is not None:
            return ResidualOutputForward(module, dense, dropout, layer_norm)
    elif is_class(module, "transformers.", "ViTMLP"):
        activation = _activation_name(child_of(module, "activation_fn"))
        fc1, fc2 = linear_forward(child_of(module, "fc1")), child_of(module, "fc2")
        if activation is not None and fc1 is not None and fc2 is not None:
            return LinearActivationForward(module, fc1, ("fc1", "activation_fn"), activation, after=("fc2", fc2))
    return None
