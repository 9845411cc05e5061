// The attention kernel for one ISA, over the ISA's float vectors (attention_body.inl). Compiled once per ISA by
// ember_kernel_family (CMakeLists.txt).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_kernels.h"
#include "simd/kernel_isa.h"

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
}  // namespace vec
// clang-format on
}  // namespace

void EMBER_KERNEL(attention_tasks)(const AttentionArgs& a, int64_t task_begin, int64_t task_end) {
  vec::attention_tasks(a, task_begin, task_end);
}

}  // namespace ember::attention::kernels
