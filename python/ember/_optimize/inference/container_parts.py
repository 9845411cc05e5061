"""What every fused container forward shares: finding a container's children, checking they are still the ones
planned on, and a convolution with its BatchNorm folded in (containers_torchvision.py, containers_transformers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ember._optimize.inference.common import foldable_batchnorm, hooks_would_be_skipped
from ember._optimize.inference.conv import ConvForward
from ember._optimize.inference.linear import LinearForward

# An activation module and its post-op name ("relu", ...).
Activation = tuple[nn.Module, str]


def is_class(module: object, module_prefix: str, *names: str) -> bool:
    """Whether ``module`` is exactly one of the classes ``names`` of a module under ``module_prefix`` (a subclass may
    have changed the forward)."""
    kind = type(module)
    return kind.__name__ in names and kind.__module__.startswith(module_prefix)


def child_of(module: nn.Module, name: str) -> nn.Module | None:
    """The child module registered under ``name``, or None."""
    return module._modules.get(name)


def installed_forward(module: nn.Module | None) -> object | None:
    """The forward ember installed on the instance, or None."""
    return None if module is None else module.__dict__.get("forward")


def linear_forward(module: nn.Module | None) -> LinearForward | None:
    """The module's installed LinearForward when a container may fuse after it (no BatchNorm folded in yet)."""
    forward = installed_forward(module)
    return forward if isinstance(forward, LinearForward) and forward.state.bn is None else None


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

    conv: _ConvNd
    bn: _BatchNorm
    forward: ConvForward

    def run(self, x: torch.Tensor, activation: Activation | None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``activation(bn(conv(x)) [+ residual])``: one call where the kernel takes it, else the modules."""
        if activation is None:
            epilogue: tuple[str, ...] = () if residual is None else ("add",)
        else:
            epilogue = (activation[1],) if residual is None else ("add", activation[1])
        out = self.forward.fused(x, epilogue, residual)
        if out is None:  # the kernel does not take this input: the modules, as the container runs them
            out = self.bn(self.conv(x))
            if residual is not None:
                out = out + residual
            if activation is not None:
                out = activation[0](out)
        return out


def conv_bn(conv: nn.Module | None, bn: nn.Module | None) -> ConvBn | None:
    """The pair, when ember can fold the BatchNorm into the convolution's kernel (:func:`claim` hands it over)."""
    forward = installed_forward(conv)
    if not isinstance(forward, ConvForward) or forward.state.bn is not None or forward.geometry.transposed:
        return None
    if not isinstance(bn, _BatchNorm) or not foldable_batchnorm(bn, forward.module.out_channels, (nn.BatchNorm2d,)):
        return None
    return ConvBn(forward.module, bn, forward)


def claim(pairs: Sequence[ConvBn]) -> None:
    """Hands each pair's BatchNorm to its convolution's kernel, which folds it in from now on."""
    for pair in pairs:
        pair.forward.state.fold(pair.bn)
