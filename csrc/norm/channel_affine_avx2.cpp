// Per-channel affine map, avx2 path (8 floats per ymm register): channel_affine_body.inl with V = Avx2F.
#include <immintrin.h>

#include <cstdint>

#include "norm_kernels.h"

namespace ember::norm::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
using V = Avx2F;
#include "channel_affine_body.inl"
// clang-format on
}  // namespace

template <typename X, typename Y>
void channel_rows_avx2(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  channel_rows(a, row_begin, row_end);
}
template <typename X, typename Y>
void position_rows_avx2(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  position_rows(a, row_begin, row_end);
}
EMBER_NORM_INSTANTIATE(avx2)

}  // namespace ember::norm::kernels
