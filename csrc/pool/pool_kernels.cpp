// Pooling for one ISA, over the ISA's float vectors (pool_body.inl). Compiled once per ISA by ember_kernel_family
// (CMakeLists.txt).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "pool_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::pool::kernels {
namespace {
// The vector types must come before the bodies that use them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
namespace vec {
using V = VecF;
#include "pool_body.inl"
}  // namespace vec
// clang-format on
}  // namespace

void EMBER_KERNEL(pool2d)(const PoolArgs& a, int64_t item_begin, int64_t item_end) {
  vec::pool2d(a, item_begin, item_end);
}

}  // namespace ember::pool::kernels
