// Adam/AdamW, ref path (the reference path: one element at a time): adam_body.inl instantiated for ScalarF and every
// storage.
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "param_access.inl"
#include "adam_body.inl"
// clang-format on
}  // namespace

template <typename S>
void adam_ref(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c) {
  adam_range<ScalarF, S>(t, begin, end, c);
}
#define EMBER_INSTANTIATE(S) template void adam_ref<S>(const AdamPointers<S>&, int64_t, int64_t, const AdamCoeffs&);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

}  // namespace ember::optim::kernels
