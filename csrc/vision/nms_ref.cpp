// nms, reference path (one box at a time): nms_body.inl with V = ScalarF.
#include <algorithm>
#include <cstdint>

#include "nms_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
using V = ScalarF;
#include "nms_body.inl"
// clang-format on
}  // namespace

void suppress_ref(const SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold) {
  suppress_range(b, i, begin, end, threshold);
}

}  // namespace ember::vision::kernels
