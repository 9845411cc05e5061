// roi_align over float64 images: roi_align_body.inl with V = ScalarD, one channel at a time in double (torchvision's
// float64 arithmetic). It is there so that gradient checks and float64 references run through the same code as the
// fast paths; every machine runs it.
#include <cstdint>
#include <type_traits>

#include "roi_align_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_strips.inl"
using V = ScalarD;
#include "roi_align_body.inl"
// clang-format on
}  // namespace

void roi_pool_f64(const RoiTaps<double>& taps, const PoolArgs<double>& a) { pool_roi(taps, a); }
void roi_scatter_f64(const RoiTaps<double>& taps, const ScatterArgs<double>& a, int64_t c_begin, int64_t c_end) {
  scatter_roi(taps, a, c_begin, c_end);
}

}  // namespace ember::vision::kernels
