"""Detection ops with torchvision's signatures on ember's kernels: ``nms`` and ``roi_align`` / ``RoIAlign``
(``torch.ops.ember.nms``, ``torch.ops.ember.roi_align``).

roi_align: torchvision's CPU kernel visits one channel at a time, one box after another on one thread. The kernel
computes each box's sample positions and bilinear weights once (torchvision's arithmetic) and sums them over a vector
of channels at a time, boxes in parallel; a row-major feature map is staged channels-last for that. Its backward
scatters into a float32 channels-last buffer, in parallel over channel blocks, boxes in order (deterministic).

torchvision's CPU nms walks the boxes in score order and tests each later box against a kept one, one pair at a
time. The kernel (csrc/vision) keeps the boxes in score order as separate coordinate arrays and tests a vector of
later boxes at once, with torchvision's arithmetic (the float IoU compared with the double threshold), so it keeps the
same boxes. Equal scores keep the lower index first (torchvision's order for ties is its sort's).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from ember import _C
from ember._library import define, needs_input_grad, tracing
from ember._tensor import arithmetic_dtype, dlpack, require_tensor, sync_threads

__all__ = ["RoIAlign", "nms", "roi_align"]

_KERNEL_DTYPES = (torch.float32, torch.float64)


def _nms_kernel(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    sync_threads()
    return from_dlpack(_C.nms(dlpack(boxes.contiguous()), dlpack(scores.contiguous()), iou_threshold))


def _nms_fake(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    if not hasattr(torch.library, "get_ctx"):
        raise NotImplementedError("nms: how many boxes survive is known only from the data (torch >= 2.2 traces it)")
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


_nms: Callable[..., torch.Tensor] = define(
    "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor", _nms_kernel, fake=_nms_fake
)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision.ops.nms: the indices (int64) of the boxes kept, in decreasing score. boxes [N, 4] as (x1, y1,
    x2, y2), scores [N]; a box is dropped when its IoU with a kept, higher-scoring box is > iou_threshold.

    float32 and float64 run on the kernel; half and bfloat16 boxes are widened to float32 first (torchvision computes
    in their own precision)."""
    if tracing(boxes):
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


# --- roi_align -------------------------------------------------------------------------------------------------------


def _roi_align_out(features: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int) -> torch.Tensor:
    # Checked here, in the kernel and the fake kernel alike, before any shape is read (torch's own messages for a
    # negative size or a missing dimension name no argument).
    if features.dim() != 4:
        raise ValueError(f"roi_align: input must be 4-D [N, C, H, W], got {list(features.shape)}")
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f"roi_align: rois must be [K, 5] (batch index, x1, y1, x2, y2), got {list(rois.shape)}")
    if pooled_height <= 0 or pooled_width <= 0:
        raise ValueError(f"roi_align: output_size must be positive, got ({pooled_height}, {pooled_width})")
    shape = (rois.shape[0], features.shape[1], pooled_height, pooled_width)
    channels_last = (
        features.dim() == 4
        and not features.is_contiguous()
        and features.is_contiguous(memory_format=torch.channels_last)
    )
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=features.dtype, device=features.device, memory_format=layout)


def _staged(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel walks it: contiguous or channels-last (else a contiguous copy)."""
    return x if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last) else x.contiguous()


def _kernel_rois(rois: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rois in the kernel's arithmetic for a ``dtype`` image (torchvision computes in the input's type)."""
    return rois.to(arithmetic_dtype(dtype)).contiguous()


def _roi_align_kernel(
    features: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    features = _staged(features)
    out = _roi_align_out(features, rois, pooled_height, pooled_width)
    sync_threads()
    _C.roi_align_forward(dlpack(features), dlpack(_kernel_rois(rois, features.dtype)), dlpack(out),
                         spatial_scale=spatial_scale, pooled_height=pooled_height, pooled_width=pooled_width,
                         sampling_ratio=sampling_ratio, aligned=aligned)  # fmt: skip
    return out


def _roi_align_fake(
    features: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    return _roi_align_out(features, rois, pooled_height, pooled_width)


def _roi_align_backward_kernel(
    grad: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
    batch: int,
    channels: int,
    height: int,
    width: int,
    channels_last: bool,
) -> torch.Tensor:
    grad = _staged(grad)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    grad_input = torch.empty((batch, channels, height, width), dtype=grad.dtype, memory_format=layout)
    sync_threads()
    _C.roi_align_backward(dlpack(grad), dlpack(_kernel_rois(rois, grad.dtype)), dlpack(grad_input),
                          spatial_scale=spatial_scale, pooled_height=pooled_height, pooled_width=pooled_width,
                          sampling_ratio=sampling_ratio, aligned=aligned)  # fmt: skip
    return grad_input


def _roi_align_backward_fake(
    grad: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
    batch: int,
    channels: int,
    height: int,
    width: int,
    channels_last: bool,
) -> torch.Tensor:
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty((batch, channels, height, width), dtype=grad.dtype, device=grad.device, memory_format=layout)


_roi_align_backward: Callable[..., torch.Tensor] = define(
    "roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
    "int sampling_ratio, bool aligned, int batch, int channels, int height, int width, bool channels_last) -> Tensor",
    _roi_align_backward_kernel,
    fake=_roi_align_backward_fake,
)


def _roi_align_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    features, rois, *options = inputs
    ctx.save_for_backward(rois)
    ctx.options = options
    ctx.shape = tuple(features.shape)
    ctx.channels_last = not features.is_contiguous() and features.is_contiguous(memory_format=torch.channels_last)


def _roi_align_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (rois,) = ctx.saved_tensors
    grad_input = None
    if needs_input_grad(ctx)[0]:
        grad_input = _roi_align_backward(grad, rois, *ctx.options, *ctx.shape, ctx.channels_last)
    return grad_input, None, None, None, None, None, None


_roi_align: Callable[..., torch.Tensor] = define(
    "roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    _roi_align_kernel,
    fake=_roi_align_fake,
    backward=_roi_align_grad,
    setup_context=_roi_align_setup,
)


def _pair(output_size: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) of torchvision's output_size: an int, or a sequence of one or two ints, each positive."""
    sides = output_size if isinstance(output_size, Sequence) else [output_size]
    if len(sides) not in (1, 2) or any(isinstance(side, bool) for side in sides):
        raise TypeError(f"roi_align: output_size must be an int or a pair of ints, got {output_size!r}")
    try:
        height, width = operator.index(sides[0]), operator.index(sides[-1])
    except TypeError:
        raise TypeError(f"roi_align: output_size must be an int or a pair of ints, got {output_size!r}") from None
    if height < 1 or width < 1:
        raise ValueError(f"roi_align: output_size must be positive, got {output_size!r}")
    return height, width


def _as_rois(boxes: torch.Tensor | list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """torchvision's two forms of boxes as one [K, 5] tensor (batch index, x1, y1, x2, y2)."""
    if isinstance(boxes, torch.Tensor):
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ValueError(f"roi_align: a boxes tensor must be [K, 5] (batch index, x1, y1, x2, y2), got "
                             f"{list(boxes.shape)}")  # fmt: skip
        return boxes
    if not isinstance(boxes, (list, tuple)):
        raise TypeError(
            f"roi_align: boxes must be a Tensor [K, 5] or a list of [L, 4] tensors, got {type(boxes).__name__}"
        )
    for i, b in enumerate(boxes):
        if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.shape[1] != 4:
            raise ValueError(f"roi_align: boxes[{i}] must be an [L, 4] tensor (x1, y1, x2, y2)")
    if not boxes:
        return like.new_empty(0, 5)
    index = torch.cat([torch.full((b.shape[0], 1), i, dtype=b.dtype) for i, b in enumerate(boxes)])
    return torch.cat([index, torch.cat(list(boxes))], dim=1)


def roi_align(
    input: torch.Tensor,  # noqa: A002 - torchvision's name
    boxes: torch.Tensor | list[torch.Tensor],
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> torch.Tensor:
    """torchvision.ops.roi_align: [K, C, output_size] features pooled from ``input`` ([N, C, H, W], float32 or
    bfloat16, or float64 on a scalar double path; row-major or channels-last) for each box. ``boxes``: a [K, 5]
    tensor (batch index, x1, y1, x2, y2) or a list with one [L, 4] tensor per image. The output follows the input's
    memory format."""
    height, width = _pair(output_size)
    if tracing(input):
        return _roi_align(input, boxes, float(spatial_scale), height, width, int(sampling_ratio), bool(aligned))
    require_tensor("roi_align", "input", input)
    rois = _as_rois(boxes, input)
    return _roi_align(input, rois, float(spatial_scale), height, width, int(sampling_ratio), bool(aligned))


class RoIAlign(nn.Module):
    """torchvision.ops.RoIAlign on ember's kernel: the same arguments, forward and repr."""

    def __init__(
        self, output_size: int | Sequence[int], spatial_scale: float, sampling_ratio: int, aligned: bool = False
    ) -> None:
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input: torch.Tensor, rois: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:  # noqa: A002
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned})")  # fmt: skip
