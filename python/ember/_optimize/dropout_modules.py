"""Dropout onto ember's kernel for training: ``nn.Dropout`` modules become ``ember.nn.Dropout``, and
``nn.MultiheadAttention`` with attention dropout becomes ``ember.nn.MultiheadAttention``.

torch's CPU dropout draws its mask serially, about 15 ns an element: 60% of a BERT-base training step on a
16-core Xeon, a third of it in the attention-probability dropouts inside MultiheadAttention. ember's draws it from
a counter-based generator on every core and keeps no mask for backward (see ember/nn/dropout.py). Only the
modules' classes change: parameters, buffers and state_dict keys stay. Subclasses are left alone, since their
forward may do something else.
"""

from __future__ import annotations

from torch import nn

from ember.nn import Dropout, MultiheadAttention


def use_ember_dropout(model: nn.Module) -> tuple[int, int]:
    """Swaps the classes; returns how many Dropout and how many MultiheadAttention modules changed."""
    dropouts = attentions = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = Dropout
            dropouts += 1
        elif type(module) is nn.MultiheadAttention and module.dropout > 0.0:
            module.__class__ = MultiheadAttention
            attentions += 1
    return dropouts, attentions
