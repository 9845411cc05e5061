"""Functional forms of ember's modules, drop-ins for their ``torch.nn.functional`` namesakes."""

from ember.nn.dropout import dropout

__all__ = ["dropout"]
