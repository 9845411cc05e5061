// The rotary embedding for one ISA, over the ISA's float vectors (rope_body.inl). Compiled once per ISA by
// ember_kernel_family (CMakeLists.txt).
#include <cstdint>

#include "rope_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::rope::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
namespace vec {
using V = VecF;
#include "rope_body.inl"
}  // namespace vec
// clang-format on
}  // namespace

void EMBER_KERNEL(rotate_half)(const RopeArgs& a, int64_t row_begin, int64_t row_end) {
  vec::rotate_half(a, row_begin, row_end);
}

}  // namespace ember::rope::kernels
