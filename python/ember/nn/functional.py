"""Functional forms of ember's modules, drop-ins for their ``torch.nn.functional`` namesakes."""

from ember.nn.dropout import dropout
from ember.nn.embedding_bag import merged_embedding_bag
from ember.nn.frozen_batch_norm import frozen_batch_norm
from ember.nn.interaction import interaction
from ember.nn.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ember.nn.vision import nms, roi_align

__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "dropout",
    "frozen_batch_norm",
    "interaction",
    "max_pool2d",
    "merged_embedding_bag",
    "nms",
    "roi_align",
]
