// The dot interaction's kernels for one ISA (interaction_body.inl over the ISA's float vectors), and in the ref
// compilation the same body in double for float64 inputs: compiled once per ISA by ember_kernel_family
// (CMakeLists.txt). The AVX512-BF16 forward has code of its own (interaction_avx512_bf16.cpp).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "interaction_kernels.h"
#include "simd/kernel_isa.h"
#include "simd/local_vector.h"

namespace ember::interaction::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
#include "simd/simd_strips.inl"
namespace vec {
using V = VecF;
#include "interaction_body.inl"
}  // namespace vec
#if EMBER_KERNEL_LEVEL == 0
namespace f64 {
using V = ScalarD;
#include "interaction_body.inl"
}  // namespace f64
#endif
// clang-format on
}  // namespace

template <typename W>
void EMBER_KERNEL(forward)(const Args<W>& a, int64_t begin, int64_t end) {
  vec::forward_range(a, begin, end);
}
template <typename W>
void EMBER_KERNEL(backward)(const Args<W>& a, int64_t begin, int64_t end) {
  vec::backward_range(a, begin, end);
}
template void EMBER_KERNEL(forward)<float>(const Args<float>&, int64_t, int64_t);
template void EMBER_KERNEL(forward)<uint16_t>(const Args<uint16_t>&, int64_t, int64_t);
template void EMBER_KERNEL(backward)<float>(const Args<float>&, int64_t, int64_t);
template void EMBER_KERNEL(backward)<uint16_t>(const Args<uint16_t>&, int64_t, int64_t);

#if EMBER_KERNEL_LEVEL == 0
void forward_f64(const Args<double>& a, int64_t begin, int64_t end) { f64::forward_range(a, begin, end); }
void backward_f64(const Args<double>& a, int64_t begin, int64_t end) { f64::backward_range(a, begin, end); }
#endif

}  // namespace ember::interaction::kernels
