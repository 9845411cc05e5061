// Per-channel affine map, avx512 path (16 floats per zmm register): channel_affine_body.inl with V = Avx512F.
#include <immintrin.h>

#include <cstdint>

#include "norm_kernels.h"

namespace ember::norm::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
using V = Avx512F;
#include "channel_affine_body.inl"
// clang-format on
}  // namespace

template <typename X, typename Y>
void channel_rows_avx512(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  channel_rows(a, row_begin, row_end);
}
template <typename X, typename Y>
void position_rows_avx512(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  position_rows(a, row_begin, row_end);
}
EMBER_NORM_INSTANTIATE(avx512)

}  // namespace ember::norm::kernels
