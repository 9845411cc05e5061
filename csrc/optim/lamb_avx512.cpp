// Lamb's two passes and LARS's sums of squares, avx512 path (16 floats per zmm register): lamb_body.inl instantiated
// for Avx512F and every storage.
#include <immintrin.h>
#include <cstdint>

#include "optim_kernels.h"

namespace ember::optim::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
#include "param_access.inl"
#include "lamb_body.inl"
// clang-format on
}  // namespace

template <typename S>
void lamb_moments_avx512(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                         double* u_sq) {
  lamb_moments_range<Avx512F, S>(t, begin, end, c, p_sq, u_sq);
}
#define EMBER_INSTANTIATE(S) \
  template void lamb_moments_avx512<S>(const LambPointers<S>&, int64_t, int64_t, const LambCoeffs&, double*, double*);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

template <typename S>
void lamb_apply_avx512(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  lamb_apply_range<Avx512F, S>(t, begin, end, c);
}
#define EMBER_INSTANTIATE(S) \
  template void lamb_apply_avx512<S>(const LambPointers<S>&, int64_t, int64_t, const LambCoeffs&);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

template <typename S>
void sum_squares_avx512(const NormPointers<S>& t, int64_t begin, int64_t end, double* p_sq, double* g_sq) {
  sum_squares_range<Avx512F, S>(t, begin, end, p_sq, g_sq);
}
#define EMBER_INSTANTIATE(S) \
  template void sum_squares_avx512<S>(const NormPointers<S>&, int64_t, int64_t, double*, double*);
EMBER_OPTIM_FOR_EACH_STORAGE(EMBER_INSTANTIATE)
#undef EMBER_INSTANTIATE

}  // namespace ember::optim::kernels
