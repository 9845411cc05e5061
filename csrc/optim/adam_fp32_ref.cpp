// Adam on fp32 tensors, ref path: the body of adam_body.inl instantiated for ScalarF.

#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
#include "simd_scalar.inl"

#include "adam_body.inl"
}  // namespace

void adam_fp32_ref(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c) {
  adam_range<ScalarF>(t, begin, end, c);
}

}  // namespace ember::optim::kernels
