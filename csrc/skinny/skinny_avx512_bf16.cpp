// Skinny matmul, AVX512-BF16 path (bf16 only): vdpbf16ps multiplies 32 bf16 pairs and adds each pair's two
// products to one of sixteen fp32 lanes, so a k step is 32 elements read as they lie, with no widening. The
// products are exact in fp32; the instruction treats denormal inputs and results as zero (Intel SDM, VDPBF16PS),
// which a trained weight or activation essentially never is. Compiled with the AVX-512 flags plus -mavx512bf16.
#include <immintrin.h>

#include <cstdint>

#include "ember/bf16.h"
#include "skinny/skinny_kernels.h"
#include "skinny/skinny_matmul.h"

namespace ember::skinny::kernels {
namespace {

// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
// clang-format on

struct Avx512Bf16Dot {
  using Vec = __m512bh;
  using Acc = __m512;
  static constexpr int kStep = 32;
  static constexpr int kRegisters = 32;
  static Acc zero() { return _mm512_setzero_ps(); }
  // A vector cast: C++ casts do not convert between vector types.
  static Vec load(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Acc madd(Acc acc, Vec w, Vec x) { return _mm512_dpbf16_ps(acc, w, x); }
  static float sum(Acc acc) { return Avx512F::hsum(acc); }
};

// clang-format off
#include "skinny/skinny_body.inl"
// clang-format on
}  // namespace

void dot_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                          int64_t n0, int64_t n1, float* y, int64_t ldy) {
  dot_rows_any<Avx512Bf16Dot, uint16_t>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}

}  // namespace ember::skinny::kernels
