// Adagrad on fp32 tensors, avx2 path: the body of adagrad_body.inl instantiated for Avx2F.
#include <immintrin.h>
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd_scalar.inl"
#include "simd_avx2.inl"
#include "adagrad_body.inl"
// clang-format on
}  // namespace

void adagrad_fp32_avx2(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<Avx2F, float>(t, begin, end, c);
}

void adagrad_bf16_avx2(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<Avx2F, uint16_t>(t, begin, end, c);
}

}  // namespace ember::optim::kernels
