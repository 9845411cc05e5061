// Per-ISA body of nms (ember/vision.h): the IoU of one kept box against a range of later boxes, marking those above
// the threshold. Boxes are in score order, as separate arrays (x1, y1, x2, y2, area), so a vector takes one
// coordinate of several boxes at once.
#pragma once

#include <cstdint>

namespace ember::vision::kernels {

struct SortedBoxes {
  const float *x1, *y1, *x2, *y2, *area;
  float* suppressed;  // 1 for a suppressed box, 0 otherwise
};

/// Marks the boxes [begin, end) whose IoU with box i exceeds threshold.
using SuppressFn = void (*)(const SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold);

// One per ISA (nms_kernels.cpp, compiled for each by ember_kernel_family).
#define EMBER_NMS_DECLARE_KERNELS(isa) \
  void suppress_##isa(const SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold);
EMBER_NMS_DECLARE_KERNELS(ref)
EMBER_NMS_DECLARE_KERNELS(avx2)
EMBER_NMS_DECLARE_KERNELS(avx512)
#undef EMBER_NMS_DECLARE_KERNELS

}  // namespace ember::vision::kernels
