// nms, avx512 path (16 boxes per zmm register): nms_body.inl with V = Avx512F.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "nms_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
using V = Avx512F;
#include "nms_body.inl"
// clang-format on
}  // namespace

void suppress_avx512(const SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold) {
  suppress_range(b, i, begin, end, threshold);
}

}  // namespace ember::vision::kernels
