"""Detection ops with torchvision's signatures on ember's kernels: ``nms`` (``torch.ops.ember.nms``).

torchvision's CPU nms walks the boxes in score order and tests each later box against a kept one, one pair at a
time. The kernel (csrc/vision) keeps the boxes in score order as separate coordinate arrays and tests a vector of
later boxes at once, with torchvision's arithmetic (the float IoU compared with the double threshold), so it keeps the
same boxes. Equal scores keep the lower index first (torchvision's order for ties is its sort's).
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import from_dlpack

from ember import _C
from ember._library import define
from ember._tensor import dlpack, require_tensor, sync_threads

__all__ = ["nms"]

_KERNEL_DTYPES = (torch.float32, torch.float64)


def _nms_kernel(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    sync_threads()
    return from_dlpack(_C.nms(dlpack(boxes.contiguous()), dlpack(scores.contiguous()), iou_threshold))


def _nms_fake(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    if not hasattr(torch.library, "get_ctx"):
        raise NotImplementedError("nms: how many boxes survive is known only from the data (torch >= 2.2 traces it)")
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


_nms = define("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor", _nms_kernel, fake=_nms_fake)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision.ops.nms: the indices (int64) of the boxes kept, in decreasing score. boxes [N, 4] as (x1, y1,
    x2, y2), scores [N]; a box is dropped when its IoU with a kept, higher-scoring box is > iou_threshold.

    float32 and float64 run on the kernel; half and bfloat16 boxes are widened to float32 first (torchvision computes
    in their own precision)."""
    if isinstance(boxes, torch.fx.Proxy):  # torch.fx symbolic tracing: the operator goes into the graph as is
        return _nms(boxes, scores, float(iou_threshold))
    require_tensor("nms", "boxes", boxes)
    require_tensor("nms", "scores", scores)
    if boxes.dtype != scores.dtype:
        raise TypeError(f"nms: boxes and scores must have one dtype, got {boxes.dtype} and {scores.dtype}")
    if boxes.dtype not in _KERNEL_DTYPES:
        if not boxes.is_floating_point():
            raise TypeError(f"nms: boxes must be floating point, got {boxes.dtype}")
        boxes, scores = boxes.float(), scores.float()
    return _nms(boxes, scores, float(iou_threshold))
