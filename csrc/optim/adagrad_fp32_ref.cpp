// Adagrad on fp32 tensors, ref path: the body of adagrad_body.inl instantiated for ScalarF.
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd_scalar.inl"
#include "adagrad_body.inl"
// clang-format on
}  // namespace

void adagrad_fp32_ref(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<ScalarF, float>(t, begin, end, c);
}

void adagrad_bf16_ref(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<ScalarF, uint16_t>(t, begin, end, c);
}

}  // namespace ember::optim::kernels
