// Sgd on fp32 tensors, avx512 path: the body of sgd_body.inl instantiated for Avx512F.
#include <immintrin.h>
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd_scalar.inl"
#include "simd_avx512.inl"
#include "sgd_body.inl"
// clang-format on
}  // namespace

void sgd_fp32_avx512(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  sgd_range<Avx512F, float>(t, begin, end, c);
}

void sgd_bf16_avx512(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  sgd_range<Avx512F, uint16_t>(t, begin, end, c);
}

}  // namespace ember::optim::kernels
