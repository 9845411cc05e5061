// Detection ops with torchvision's semantics.
//
// nms: greedy non-maximum suppression (torchvision.ops.nms). Boxes (x1, y1, x2, y2) are visited in decreasing score
// (equal scores: lower index first, where torchvision's order is unspecified); each box not yet suppressed is kept and
// suppresses every later box whose IoU with it is > iou_threshold, computed as torchvision's CPU kernel does:
//   w = max(0, min(x2_i, x2_j) - max(x1_i, x1_j)), h likewise, inter = w * h,
//   iou = inter / (area_i + area_j - inter),  area = (x2 - x1) * (y2 - y1),
// in the boxes' precision (float32, vectorized over the later boxes; float64, one at a time).
#pragma once

#include <cstdint>
#include <vector>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::vision {

/// The level of the nms implementation that runs under the current ISA cap (float32 boxes).
Isa nms_implementation();

/// The indices of the kept boxes, in decreasing score. boxes [N, 4] and scores [N], both float32 or both float64,
/// contiguous; iou_threshold any number (NaN keeps every box, as torchvision's comparison does).
std::vector<int64_t> nms(const TensorView& boxes, const TensorView& scores, double iou_threshold);

}  // namespace ember::vision

namespace ember::vision {

// roi_align: torchvision.ops.roi_align. Each box (batch index, x1, y1, x2, y2) is scaled by spatial_scale (and
// shifted by half a pixel when aligned), cut into pooled_height x pooled_width bins, and each bin averages a
// grid_h x grid_w grid of bilinear samples of the input (grid = sampling_ratio, or ceil(box size / bins) when it is
// <= 0). The sample positions and weights are torchvision's CPU kernel's, computed in float32 (float64 for a
// float64 input, as torchvision computes in the input's type; that path runs in double on every machine); a sample
// outside [-1, H] x [-1, W] counts as zero. The average is over the grid size, taken once per bin. The backward
// scatters each bin's gradient to the same samples; it runs in parallel over channel blocks, each block walking the
// boxes in order, so the sums do not depend on the thread count (torchvision's is sequential).

struct RoiAlignOptions {
  double spatial_scale = 1.0;
  int64_t pooled_height = 1;
  int64_t pooled_width = 1;
  int64_t sampling_ratio = -1;
  bool aligned = false;
};

/// The level of the roi_align implementation that runs under the current ISA cap.
Isa roi_align_implementation();

/// out[k] = the pooled features of box k. input [N, C, H, W] float32, bfloat16 or float64, contiguous or
/// channels-last; rois [K, 5] float32 (float64 for a float64 input), contiguous, batch indices whole numbers in
/// [0, N); out [K, C, PH, PW] of the input's
/// dtype, contiguous or channels-last (either, independent of the input's). Checked before anything is written.
void roi_align_forward(const TensorView& input, const TensorView& rois, const RoiAlignOptions& options,
                       const TensorView& out);

/// grad_input = the gradient of the input given grad_out ([K, C, PH, PW], contiguous or channels-last, the
/// input's dtype); grad_input [N, C, H, W], contiguous or channels-last, is overwritten.
void roi_align_backward(const TensorView& grad_out, const TensorView& rois, const RoiAlignOptions& options,
                        const TensorView& grad_input);

}  // namespace ember::vision
