// The attention kernel for one ISA, over the ISA's float vectors (attention_body.inl); the avx512_bf16 compilation
// runs bf16 calls on vdpbf16ps instead (attention_pairs_body.inl). The few-query path
// (attention_few_queries_body.inl) on the same vectors. Compiled once per ISA by ember_kernel_family
// (CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
namespace few {
using V = VecF;
#include "attention_few_queries_body.inl"
}  // namespace few
// clang-format on
}  // namespace

void EMBER_KERNEL(attention_tasks)(const AttentionArgs& a, int64_t task_begin, int64_t task_end) {
#if EMBER_KERNEL_LEVEL == 3
  vec::attention_tasks_pairs(a, task_begin, task_end);
#else
  vec::attention_tasks(a, task_begin, task_end);
#endif
}

void EMBER_KERNEL(few_query_tasks)(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end) {
  few::few_query_tasks(a, part, begin, end);
}

void EMBER_KERNEL(few_query_combine)(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end) {
  few::few_query_combine(a, part, begin, end);
}

}  // namespace ember::attention::kernels
