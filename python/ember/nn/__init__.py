"""Modules backed by ember's kernels, drop-ins for their ``torch.nn`` namesakes (``ember.optimize`` swaps them in;
they can also be used directly)."""

from ember.nn import functional
from ember.nn.attention import MultiheadAttention
from ember.nn.dropout import Dropout
from ember.nn.embedding_bag import MergedEmbeddingBag, merged_embedding_bag

__all__ = ["Dropout", "MergedEmbeddingBag", "MultiheadAttention", "functional", "merged_embedding_bag"]
