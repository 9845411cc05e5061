// Epilogue, reference path: one lane at a time, on any x86-64 CPU. Compiled with the baseline flags.
#include <cstdint>
#include <type_traits>

#include "epilogue/epilogue_kernels.h"

namespace ember::epilogue::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_math.inl"
#include "epilogue/epilogue_body.inl"
// clang-format on
}  // namespace

void finish_row_ref(const Row& row) { finish_row<ScalarF>(row); }

}  // namespace ember::epilogue::kernels
