// Adam/AdamW, avx2 path (8 floats per ymm register): adam_body.inl instantiated for Avx2F and every storage.
#include <immintrin.h>
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
#include "param_access.inl"
#include "adam_body.inl"
// clang-format on
}  // namespace

template <typename S>
void adam_avx2(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c) {
  adam_range<Avx2F, S>(t, begin, end, c);
}
#define EMBER_INSTANTIATE(S) template void adam_avx2<S>(const AdamPointers<S>&, int64_t, int64_t, const AdamCoeffs&);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

}  // namespace ember::optim::kernels
