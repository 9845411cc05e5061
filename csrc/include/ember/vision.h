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
