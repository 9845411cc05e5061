// The epilogue's kernel for one ISA (epilogue_body.inl over the ISA's float vectors): compiled once per ISA by
// ember_kernel_family (CMakeLists.txt).
#include <cstdint>
#include <type_traits>

#include "epilogue/epilogue_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::epilogue::kernels {
namespace {
// clang-format off
#include "simd/kernel_simd.inl"
#include "simd/simd_math.inl"
#include "epilogue/epilogue_body.inl"
// clang-format on
}  // namespace

void EMBER_KERNEL(finish_row)(const Row& row) { finish_row<VecF>(row); }

}  // namespace ember::epilogue::kernels
