// NMS's suppression kernel for one ISA (nms_body.inl over the ISA's float vectors, as many boxes a register):
// compiled once per ISA by ember_kernel_family (CMakeLists.txt).
#include <algorithm>
#include <cstdint>

#include "nms_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
using V = VecF;
#include "nms_body.inl"
// clang-format on
}  // namespace

void EMBER_KERNEL(suppress)(const SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold) {
  suppress_range(b, i, begin, end, threshold);
}

}  // namespace ember::vision::kernels
