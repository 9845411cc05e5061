"""Fused optimizers: drop-in replacements for torch.optim whose step is one parallel pass over memory.

``ember.optim.Adam``, ``AdamW``, ``SGD`` and ``Adagrad`` take torch.optim's arguments, keep torch.optim's state
layout (their ``state_dict`` loads into torch.optim and the other way round) and match its results to rounding.
``Lamb`` and ``LARS``, which torch.optim lacks, follow their published definitions (see their docstrings).
All six take float32, bfloat16 and split-BF16 parameters (``FusedOptimizer.split_master_weights``).
"""

from ember.optim._base import FusedOptimizer
from ember.optim.adagrad import Adagrad
from ember.optim.adam import Adam, AdamW
from ember.optim.lamb import LARS, Lamb
from ember.optim.sgd import SGD

__all__ = ["LARS", "SGD", "Adagrad", "Adam", "AdamW", "FusedOptimizer", "Lamb"]
