// Per-channel affine map over float64 tensors: channel_affine_body.inl with V = ScalarD, one double at a time. It is
// there so that gradient checks and float64 references run through the same code as the fast paths; every machine
// runs it.
#include <cstdint>

#include "norm_kernels.h"

namespace ember::norm::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
using V = ScalarD;
#include "channel_affine_body.inl"
// clang-format on
}  // namespace

void channel_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end) {
  channel_rows(a, row_begin, row_end);
}
void position_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end) {
  position_rows(a, row_begin, row_end);
}

}  // namespace ember::norm::kernels
