// Adagrad, ref path (the reference path: one element at a time): adagrad_body.inl instantiated for ScalarF and every
// storage.
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "param_access.inl"
#include "adagrad_body.inl"
// clang-format on
}  // namespace

template <typename S>
void adagrad_ref(const AdagradPointers<S>& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<ScalarF, S>(t, begin, end, c);
}
#define EMBER_INSTANTIATE(S) \
  template void adagrad_ref<S>(const AdagradPointers<S>&, int64_t, int64_t, const AdagradCoeffs&);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

}  // namespace ember::optim::kernels
