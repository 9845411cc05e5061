// The optimizer steps' kernels for one ISA: compiled once per ISA by ember_kernel_family (CMakeLists.txt), each
// compilation defining the EMBER_KERNEL(...) entry points optim_kernels.h declares, for every storage.
#include <cstdint>

#include "optim_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
#include "param_access.inl"
#include "adam_body.inl"
#include "sgd_body.inl"
#include "adagrad_body.inl"
#include "lamb_body.inl"
// clang-format on
}  // namespace

template <typename S>
void EMBER_KERNEL(adam)(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c) {
  adam_range<VecF, S>(t, begin, end, c);
}
template <typename S>
void EMBER_KERNEL(sgd)(const SgdPointers<S>& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  sgd_range<VecF, S>(t, begin, end, c);
}
template <typename S>
void EMBER_KERNEL(adagrad)(const AdagradPointers<S>& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  adagrad_range<VecF, S>(t, begin, end, c);
}
template <typename S>
void EMBER_KERNEL(lamb_moments)(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                                double* u_sq) {
  lamb_moments_range<VecF, S>(t, begin, end, c, p_sq, u_sq);
}
template <typename S>
void EMBER_KERNEL(lamb_apply)(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  lamb_apply_range<VecF, S>(t, begin, end, c);
}
template <typename S>
void EMBER_KERNEL(sum_squares)(const NormPointers<S>& t, int64_t begin, int64_t end, double* p_sq, double* g_sq) {
  sum_squares_range<VecF, S>(t, begin, end, p_sq, g_sq);
}

#define EMBER_INSTANTIATE(S)                                                                                        \
  template void EMBER_KERNEL(adam)<S>(const AdamPointers<S>&, int64_t, int64_t, const AdamCoeffs&);                 \
  template void EMBER_KERNEL(sgd)<S>(const SgdPointers<S>&, int64_t, int64_t, const SgdCoeffs&);                    \
  template void EMBER_KERNEL(adagrad)<S>(const AdagradPointers<S>&, int64_t, int64_t, const AdagradCoeffs&);        \
  template void EMBER_KERNEL(lamb_moments)<S>(const LambPointers<S>&, int64_t, int64_t, const LambCoeffs&, double*, \
                                              double*);                                                             \
  template void EMBER_KERNEL(lamb_apply)<S>(const LambPointers<S>&, int64_t, int64_t, const LambCoeffs&);           \
  template void EMBER_KERNEL(sum_squares)<S>(const NormPointers<S>&, int64_t, int64_t, double*, double*);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

}  // namespace ember::optim::kernels
