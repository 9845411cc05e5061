"""Modules backed by ember's kernels, drop-ins for their ``torch.nn`` namesakes (``ember.optimize`` swaps them in;
they can also be used directly)."""

from ember.nn import functional
from ember.nn.attention import MultiheadAttention
from ember.nn.dropout import Dropout

__all__ = ["Dropout", "MultiheadAttention", "functional"]
