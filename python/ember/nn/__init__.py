"""Modules backed by ember's kernels, drop-ins for their ``torch.nn`` namesakes (``ember.optimize`` swaps them in;
they can also be used directly)."""

from ember.nn import functional
from ember.nn.attention import MultiheadAttention
from ember.nn.dropout import Dropout
from ember.nn.embedding_bag import MergedEmbeddingBag, merged_embedding_bag
from ember.nn.embedding_bag_fused import MergedEmbeddingBagWithAdagrad, MergedEmbeddingBagWithSGD, dense_parameters
from ember.nn.frozen_batch_norm import FrozenBatchNorm2d
from ember.nn.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from ember.nn.vision import RoIAlign

__all__ = [
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "Dropout",
    "FrozenBatchNorm2d",
    "MaxPool2d",
    "MergedEmbeddingBag",
    "MergedEmbeddingBagWithAdagrad",
    "MergedEmbeddingBagWithSGD",
    "MultiheadAttention",
    "RoIAlign",
    "dense_parameters",
    "functional",
    "merged_embedding_bag",
]
