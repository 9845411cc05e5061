"""Functional forms of ember's modules, drop-ins for their ``torch.nn.functional`` namesakes."""

from ember.nn.dropout import dropout
from ember.nn.embedding_bag import merged_embedding_bag
from ember.nn.interaction import interaction

__all__ = ["dropout", "interaction", "merged_embedding_bag"]
