// roi_align, avx2 path (8 channels per ymm register): roi_align_body.inl with V = Avx2F.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "roi_align_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
#include "simd/simd_strips.inl"
using V = Avx2F;
#include "roi_align_body.inl"
// clang-format on
}  // namespace

template <typename W>
void roi_pool_avx2(const RoiTaps<float>& taps, const PoolArgs<W>& a) {
  pool_roi(taps, a);
}
template <typename W>
void roi_scatter_avx2(const RoiTaps<float>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end) {
  scatter_roi(taps, a, c_begin, c_end);
}
EMBER_ROI_ALIGN_INSTANTIATE(avx2)

}  // namespace ember::vision::kernels
