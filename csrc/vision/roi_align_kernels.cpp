// RoIAlign's kernels for one ISA (roi_align_body.inl over the ISA's float vectors), and in the ref compilation the
// same body in double for float64 images: compiled once per ISA by ember_kernel_family (CMakeLists.txt).
#include <cstdint>
#include <type_traits>

#include "roi_align_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::vision::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
#include "simd/simd_strips.inl"
namespace vec {
using V = VecF;
#include "roi_align_body.inl"
}  // namespace vec
#if EMBER_KERNEL_LEVEL == 0
namespace f64 {
using V = ScalarD;
#include "roi_align_body.inl"
}  // namespace f64
#endif
// clang-format on
}  // namespace

template <typename W>
void EMBER_KERNEL(roi_pool)(const RoiTaps<float>& taps, const PoolArgs<W>& a) {
  vec::pool_roi(taps, a);
}
template <typename W>
void EMBER_KERNEL(roi_scatter)(const RoiTaps<float>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end) {
  vec::scatter_roi(taps, a, c_begin, c_end);
}
template void EMBER_KERNEL(roi_pool)<float>(const RoiTaps<float>&, const PoolArgs<float>&);
template void EMBER_KERNEL(roi_pool)<uint16_t>(const RoiTaps<float>&, const PoolArgs<uint16_t>&);
template void EMBER_KERNEL(roi_scatter)<float>(const RoiTaps<float>&, const ScatterArgs<float>&, int64_t, int64_t);
template void EMBER_KERNEL(roi_scatter)<uint16_t>(const RoiTaps<float>&, const ScatterArgs<uint16_t>&, int64_t,
                                                  int64_t);

#if EMBER_KERNEL_LEVEL == 0
void roi_pool_f64(const RoiTaps<double>& taps, const PoolArgs<double>& a) { f64::pool_roi(taps, a); }
void roi_scatter_f64(const RoiTaps<double>& taps, const ScatterArgs<double>& a, int64_t c_begin, int64_t c_end) {
  f64::scatter_roi(taps, a, c_begin, c_end);
}
#endif

}  // namespace ember::vision::kernels
