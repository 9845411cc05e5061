// Epilogue, AVX2 path: eight fp32 lanes. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "epilogue/epilogue_kernels.h"

namespace ember::epilogue::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
#include "simd/simd_math.inl"
#include "epilogue/epilogue_body.inl"
// clang-format on
}  // namespace

void finish_row_avx2(const Row& row) { finish_row<Avx2F>(row); }

}  // namespace ember::epilogue::kernels
