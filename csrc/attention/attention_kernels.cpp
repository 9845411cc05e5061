// The attention kernel for one ISA, over the ISA's float vectors (attention_body.inl); the avx512_bf16 compilation
// runs bf16 calls on vdpbf16ps instead (attention_pairs_body.inl). Compiled once per ISA by ember_kernel_family
// (CMakeLists.txt).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attention_kernels.h"
#include "simd/kernel_isa.h"
#include "simd/local_vector.h"

namespace ember::attention::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
#include "simd/simd_math.inl"
#include "attention_mask.inl"
namespace vec {
using V = VecF;
#include "attention_body.inl"
#if EMBER_KERNEL_LEVEL == 3
#include "attention_pairs_body.inl"
#endif
}  // namespace vec
// clang-format on
}  // namespace

void EMBER_KERNEL(attention_tasks)(const AttentionArgs& a, int64_t task_begin, int64_t task_end) {
#if EMBER_KERNEL_LEVEL == 3
  vec::attention_tasks_pairs(a, task_begin, task_end);
#else
  vec::attention_tasks(a, task_begin, task_end);
#endif
}

}  // namespace ember::attention::kernels
