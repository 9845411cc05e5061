"""Dropout removal for inference: a dropout module's forward becomes the identity in eval mode.

torch's eval-mode dropout already returns its input, but only after a Python call into ``F.dropout`` and the
dispatcher; the installed forward returns the input at once, and in train mode runs the module's own forward, so
a model put back into training still drops out.
"""

from __future__ import annotations

import torch
from torch import nn

from ember._optimize.inference.common import class_forward, install_forwards

_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


class DropoutForward:
    """The installed forward of a dropout module (see the module docstring)."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        module = self.module
        if not module.training:
            return input
        return class_forward(module, input)

    def __repr__(self) -> str:
        return f"DropoutForward({type(self.module).__name__})"


def remove_dropout(model: nn.Module) -> int:
    """Installs :class:`DropoutForward` on every torch dropout module of ``model``; returns how many."""
    return install_forwards(model, lambda m: type(m) in _DROPOUTS, DropoutForward)
