// Sgd on fp32 tensors, avx2 path: the body of sgd_body.inl instantiated for Avx2F.
#include <immintrin.h>
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd_scalar.inl"
#include "simd_avx2.inl"
#include "sgd_body.inl"
// clang-format on
}  // namespace

void sgd_fp32_avx2(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  sgd_range<Avx2F, float>(t, begin, end, c);
}

void sgd_bf16_avx2(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  sgd_range<Avx2F, uint16_t>(t, begin, end, c);
}

}  // namespace ember::optim::kernels
