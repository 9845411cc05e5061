"""A model's forward under ``torch.autocast("cpu", dtype)``, so that an optimized model takes fp32 inputs as is.

ember's bf16 parameters need bf16 activations, and the ops ember does not own should follow torch's autocast
rules (softmax, losses and norms in fp32, matmuls and convolutions in bf16). Running the top-level forward under
autocast does both, and nests harmlessly inside a user's own ``torch.autocast`` block (the IPEX way of writing the
loop). It is installed as an instance attribute, which ``nn.Module.__call__`` (and so DDP) calls instead of the
class's ``forward``; the attribute is a plain picklable object, so ``copy.deepcopy`` and ``torch.save`` of the
whole model keep working.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class AutocastForward:
    """Calls ``type(module).forward(module, ...)`` under CPU autocast to ``dtype``, or ``inner(...)``: the forward
    ember's inference rewrite installed on the same module (a fused Sequential that is the whole model)."""

    _ember_forward = True

    def __init__(self, module: nn.Module, dtype: torch.dtype, inner: Any = None) -> None:
        self.module = module
        self.dtype = dtype
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=self.dtype):
            if self.inner is not None:
                return self.inner(*args, **kwargs)
            return type(self.module).forward(self.module, *args, **kwargs)

    def __repr__(self) -> str:
        return f"AutocastForward({type(self.module).__name__}, dtype={self.dtype})"


class Float32Forward:
    """Calls ``type(module).forward(module, ...)`` with autocast off and floating inputs in float32: for layers
    that stay fp32 because the running torch cannot run them in bf16 on this CPU, and that autocast would
    otherwise send to the same bf16 kernel (torch 2.x's CPU autocast runs LSTMs through oneDNN in bf16)."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            return type(self.module).forward(self.module, *_float32(args), **_float32(kwargs))

    def __repr__(self) -> str:
        return f"Float32Forward({type(self.module).__name__})"


def _float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    return value


def install_float32_forward(module: nn.Module) -> None:
    """Makes ``module`` run in float32 with autocast off (see :class:`Float32Forward`)."""
    if not isinstance(module.__dict__.get("forward"), Float32Forward):
        module.__dict__["forward"] = Float32Forward(module)


def check_forward_replaceable(model: nn.Module) -> None:
    """Raises if ``model.forward`` is an instance attribute other than ember's own forwards (which it would hide).
    Every forward ember installs has the class attribute ``_ember_forward``."""
    existing = model.__dict__.get("forward")
    if existing is not None and not getattr(existing, "_ember_forward", False):
        raise ValueError(
            "ember.optimize: model.forward is replaced by an instance attribute "
            f"({type(existing).__name__}); call ember.optimize before wrapping the forward"
        )


def install_autocast_forward(model: nn.Module, dtype: torch.dtype, inner: Any = None) -> None:
    """Makes ``model``'s forward (or ``inner``, see :class:`AutocastForward`) run under CPU autocast to ``dtype``
    (replacing an earlier ember wrapper; a model that is itself a layer running in fp32 with autocast off keeps
    that). :func:`check_forward_replaceable` first."""
    if not isinstance(model.__dict__.get("forward"), Float32Forward):
        model.__dict__["forward"] = AutocastForward(model, dtype, inner)
