// roi_align, reference path (one channel at a time): roi_align_body.inl with V = ScalarF.
#include <cstdint>
#include <type_traits>

#include "roi_align_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_strips.inl"
using V = ScalarF;
#include "roi_align_body.inl"
// clang-format on
}  // namespace

template <typename W>
void roi_pool_ref(const RoiTaps<float>& taps, const PoolArgs<W>& a) {
  pool_roi(taps, a);
}
template <typename W>
void roi_scatter_ref(const RoiTaps<float>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end) {
  scatter_roi(taps, a, c_begin, c_end);
}
EMBER_ROI_ALIGN_INSTANTIATE(ref)

}  // namespace ember::vision::kernels
