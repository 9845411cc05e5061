// Skinny matmul, AVX-512 path: sixteen fp32 lanes of partial sums per (row of x, row of w), bf16 widened to fp32
// by a shift on load; as many rows of w in flight as the 32 zmm registers hold accumulators for. Compiled with the
// AVX-512 F/BW/VL/DQ flags.
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

struct Avx512Dot {
  using Vec = __m512;
  using Acc = __m512;
  static constexpr int kStep = 16;
  static constexpr int kRegisters = 32;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return Avx512F::load(p); }
  static Vec load(const uint16_t* p) { return Avx512F::load(p); }
  static Acc madd(Acc acc, Vec w, Vec x) { return _mm512_fmadd_ps(w, x, acc); }
  static float sum(Acc acc) { return Avx512F::hsum(acc); }
};

// clang-format off
#include "skinny/skinny_body.inl"
// clang-format on
}  // namespace

template <typename S>
void dot_rows_avx512(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                     float* y, int64_t ldy) {
  dot_rows_any<Avx512Dot, S>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}
template void dot_rows_avx512<float>(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                     float*, int64_t);
template void dot_rows_avx512<uint16_t>(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                                        int64_t, float*, int64_t);

}  // namespace ember::skinny::kernels
