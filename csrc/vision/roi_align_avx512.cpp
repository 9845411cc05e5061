// roi_align, avx512 path (16 channels per zmm register): roi_align_body.inl with V = Avx512F.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "roi_align_kernels.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
#include "simd/simd_strips.inl"
using V = Avx512F;
#include "roi_align_body.inl"
// clang-format on
}  // namespace

template <typename W>
void roi_pool_avx512(const RoiTaps<float>& taps, const PoolArgs<W>& a) {
  pool_roi(taps, a);
}
template <typename W>
void roi_scatter_avx512(const RoiTaps<float>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end) {
  scatter_roi(taps, a, c_begin, c_end);
}
EMBER_ROI_ALIGN_INSTANTIATE(avx512)

}  // namespace ember::vision::kernels
