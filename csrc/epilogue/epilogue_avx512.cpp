// Epilogue, AVX-512 path: sixteen fp32 lanes. Compiled with the AVX-512 F/BW/VL/DQ flags.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "epilogue/epilogue_kernels.h"

namespace ember::epilogue::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
#include "simd/simd_math.inl"
#include "epilogue/epilogue_body.inl"
// clang-format on
}  // namespace

void finish_row_avx512(const Row& row) { finish_row<Avx512F>(row); }

}  // namespace ember::epilogue::kernels
