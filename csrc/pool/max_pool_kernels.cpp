// Max pooling for one ISA, over the ISA's float vectors (max_pool_body.inl). Compiled once per ISA by
// ember_kernel_family (CMakeLists.txt).
#include <cstdint>
#include <limits>

#include "max_pool_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::pool::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
namespace vec {
using V = VecF;
#include "max_pool_body.inl"
}  // namespace vec
// clang-format on
}  // namespace

void EMBER_KERNEL(max_pool2d)(const MaxPoolArgs& a, int64_t row_begin, int64_t row_end) {
  vec::max_pool2d(a, row_begin, row_end);
}

}  // namespace ember::pool::kernels
