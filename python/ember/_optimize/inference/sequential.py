"""Fusion inside ``nn.Sequential``: a Linear or convolution followed by a BatchNorm (1d after a Linear or Conv1d,
2d after a Conv2d, 3d after a Conv3d), activations (ReLU, GELU, SiLU, Sigmoid, Tanh) or eval-mode Dropouts runs
as one call of ember's layer, with the BatchNorm folded into the weights and the activations as its epilogue.

Every module stays in the Sequential under its index, so the state_dict and the module tree are unchanged; the
Sequential gets a forward (an instance attribute) that walks a plan of steps. A fused step runs as one kernel call
when :func:`~ember._optimize.inference.common.fast_path_allowed` holds for all its modules and the kernel takes the
input, and as its modules one by one otherwise, so training mode, autograd and odd inputs see torch's semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ember._optimize.inference.common import (
    class_forward,
    fast_path_allowed,
    foldable_batchnorm,
    hooks_would_be_skipped,
)
from ember._optimize.inference.conv import BATCHNORM_OF, ConvForward
from ember._optimize.inference.linear import LinearForward


def activation_name(module: nn.Module) -> str | None:
    """The epilogue name of an activation module ember fuses, or None."""
    kind = type(module)
    if kind is nn.ReLU:
        return "relu"
    if kind is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(getattr(module, "approximate", "none"))
    return {
        nn.SiLU: "silu",
        nn.Sigmoid: "sigmoid",
        nn.Tanh: "tanh",
        nn.Hardswish: "hardswish",
        nn.Hardsigmoid: "hardsigmoid",
        nn.ReLU6: "relu6",
    }.get(kind)


def _batchnorm_rule(
    forward: LinearForward | ConvForward, flags: FoldFlags
) -> tuple[int, tuple[type[_BatchNorm], ...]] | None:
    """(output channels, BatchNorm classes) the layer of ``forward`` may fold, or None."""
    if isinstance(forward, LinearForward) and flags.linear:
        return forward.state.weight().shape[0], (nn.BatchNorm1d,)
    if isinstance(forward, ConvForward) and flags.conv and not forward.geometry.transposed:
        conv = forward.module
        return conv.out_channels, (BATCHNORM_OF[type(conv)],)
    return None


@dataclass(frozen=True)
class FoldFlags:
    linear: bool
    conv: bool


@dataclass
class Step:
    """Modules ``modules`` of the Sequential, run as one fused call when ``layer`` (the installed forward of the
    first) is set."""

    modules: list[nn.Module]
    layer: LinearForward | ConvForward | None = None
    epilogue: list[str] = field(default_factory=list)
    folds_bn: bool = False


class SequentialForward:
    """The forward of a Sequential with fused steps (see the module docstring)."""

    _ember_forward = True

    def __init__(self, module: nn.Sequential, steps: list[Step]) -> None:
        self.module = module
        self.steps = steps
        # The planned modules themselves, not their id()s: copy.deepcopy and pickling map these references to the
        # copy's modules (ids would differ in the copy and silently turn fusion off there).
        self.order = tuple(m for s in steps for m in s.modules)

    def _intact(self) -> bool:
        modules = self.module._modules
        if len(modules) != len(self.order):
            return False
        for current, planned in zip(modules.values(), self.order):  # noqa: SIM110 - hot path
            if current is not planned:
                return False
        return True

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        module = self.module
        if not self._intact():  # changed after optimizing: run it as torch would
            return class_forward(module, input)
        x = input
        for step in self.steps:
            out = None
            layer = step.layer
            if layer is not None and fast_path_allowed(step.modules, x) and not hooks_would_be_skipped(step.modules):
                out = layer.fused(x, step.epilogue)
            if out is None:
                for m in step.modules:
                    x = m(x)
            else:
                x = out
        return x

    def __repr__(self) -> str:
        fused = sum(1 for s in self.steps if s.layer is not None)
        return f"SequentialForward({fused} fused step(s))"


def plan(seq: nn.Sequential, flags: FoldFlags) -> list[Step]:
    """Groups the Sequential's modules into steps: each Linear or convolution with an installed ember forward takes
    the BatchNorm (when folding), eval-mode Dropouts and activations right after it."""
    mods = list(seq)
    steps: list[Step] = []
    i = 0
    while i < len(mods):
        m = mods[i]
        forward = m.__dict__.get("forward")
        if not isinstance(forward, (LinearForward, ConvForward)) or forward.state.bn is not None:
            steps.append(Step([m]))
            i += 1
            continue
        step = Step([m], layer=forward)
        j = i + 1
        rule = _batchnorm_rule(forward, flags)
        bn = mods[j] if j < len(mods) else None
        folded: _BatchNorm | None = None
        if rule is not None and isinstance(bn, _BatchNorm) and foldable_batchnorm(bn, *rule):
            step.modules.append(bn)
            step.folds_bn = True
            folded = bn
            j += 1
        while j < len(mods):
            name = activation_name(mods[j])
            if name is None and not isinstance(mods[j], nn.Dropout):
                break
            if name is not None:
                step.epilogue.append(name)
            step.modules.append(mods[j])
            j += 1
        if len(step.modules) == 1:
            steps.append(Step([m]))
        else:
            if folded is not None:
                forward.state.fold(folded)
            steps.append(step)
        i = j
    return steps


def fuse_sequentials(model: nn.Module, flags: FoldFlags) -> tuple[int, int]:
    """Installs a fused forward on every plain ``nn.Sequential`` (or subclass that keeps Sequential's forward) of
    ``model`` that has something to fuse; returns (fused steps, folded BatchNorms)."""
    fused = folded = 0
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential) or type(seq).forward is not nn.Sequential.forward:
            continue
        if "forward" in seq.__dict__:
            continue
        steps = plan(seq, flags)
        fused_steps = [s for s in steps if s.layer is not None]
        if fused_steps:
            seq.__dict__["forward"] = SequentialForward(seq, steps)
            fused += len(fused_steps)
            folded += sum(1 for s in fused_steps if s.folds_bn)
    return fused, folded
