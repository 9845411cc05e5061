// Lamb's passes and LARS's sums of squares on fp32 tensors, ref path: lamb_body.inl for ScalarF.
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd_scalar.inl"
#include "lamb_body.inl"
// clang-format on
}  // namespace

void lamb_moments_fp32_ref(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                           double* u_sq) {
  lamb_moments_range<ScalarF>(t, begin, end, c, p_sq, u_sq);
}

void lamb_apply_fp32_ref(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  lamb_apply_range<ScalarF>(t, begin, end, c);
}

void sum_squares_fp32_ref(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq) {
  sum_squares_range<ScalarF>(a, b, begin, end, a_sq, b_sq);
}

}  // namespace ember::optim::kernels
