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
    """Calls ``type(module).forward(module, ...)`` under CPU autocast to ``dtype``."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        self.module = module
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=self.dtype):
            return type(self.module).forward(self.module, *args, **kwargs)

    def __repr__(self) -> str:
        return f"AutocastForward({type(self.module).__name__}, dtype={self.dtype})"


def install_autocast_forward(model: nn.Module, dtype: torch.dtype) -> None:
    """Makes ``model``'s forward run under CPU autocast to ``dtype`` (replacing an earlier ember wrapper)."""
    existing = model.__dict__.get("forward")
    if existing is not None and not isinstance(existing, AutocastForward):
        raise ValueError(
            "ember.optimize: model.forward is already replaced by an instance attribute "
            f"({type(existing).__name__}); apply ember.optimize before wrapping the forward"
        )
    model.__dict__["forward"] = AutocastForward(model, dtype)
