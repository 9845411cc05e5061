// The vector interface of the ISA this kernel translation unit is compiled for (csrc/simd/kernel_isa.h), included
// inside the family's anonymous namespace so that code compiled with wide-vector flags stays private to it: the
// scalar types always, and VecF, the widest float vector the ISA has (ScalarF, Avx2F or Avx512F).
// clang-format off
#include "simd/simd_scalar.inl"
#if EMBER_KERNEL_LEVEL >= 2
#include "simd/simd_avx512.inl"
using VecF = Avx512F;
#elif EMBER_KERNEL_LEVEL == 1
#include "simd/simd_avx2.inl"
using VecF = Avx2F;
#else
using VecF = ScalarF;
#endif
// clang-format on
