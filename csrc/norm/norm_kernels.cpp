// The normalisation kernels for one ISA, over the ISA's float vectors: the per-channel affine map (FrozenBatchNorm2d,
// channel_affine_body.inl; in the ref compilation the same body in double too) and the row normalisations
// (row_norm_body.inl). Compiled once per ISA by ember_kernel_family (CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "norm_kernels.h"
#include "simd/kernel_isa.h"
#include "simd/local_vector.h"

namespace ember::norm::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
namespace vec {
using V = VecF;
#include "channel_affine_body.inl"
}  // namespace vec
namespace rows {
using V = VecF;
#include "row_norm_body.inl"
}  // namespace rows
#if EMBER_KERNEL_LEVEL == 0
namespace f64 {
using V = ScalarD;
#include "channel_affine_body.inl"
}  // namespace f64
#endif
// clang-format on
}  // namespace

template <typename X, typename Y>
void EMBER_KERNEL(channel_rows)(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  vec::channel_rows(a, row_begin, row_end);
}
template <typename X, typename Y>
void EMBER_KERNEL(position_rows)(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  vec::position_rows(a, row_begin, row_end);
}
#define EMBER_INSTANTIATE(X, Y)                                                              \
  template void EMBER_KERNEL(channel_rows)<X, Y>(const AffineArgs<X, Y>&, int64_t, int64_t); \
  template void EMBER_KERNEL(position_rows)<X, Y>(const AffineArgs<X, Y>&, int64_t, int64_t);
EMBER_INSTANTIATE(float, float)
EMBER_INSTANTIATE(uint16_t, float)
EMBER_INSTANTIATE(uint16_t, uint16_t)
#undef EMBER_INSTANTIATE

void EMBER_KERNEL(row_norm)(const RowNormArgs& a, int64_t row_begin, int64_t row_end) {
  rows::row_norm(a, row_begin, row_end);
}

#if EMBER_KERNEL_LEVEL == 0
void channel_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end) {
  f64::channel_rows(a, row_begin, row_end);
}
void position_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end) {
  f64::position_rows(a, row_begin, row_end);
}
#endif

}  // namespace ember::norm::kernels
