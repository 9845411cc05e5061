// Skinny matmul, AVX2 path: eight fp32 lanes of partial sums per (row of x, row of w), bf16 widened to fp32 by a
// shift on load; as many rows of w in flight as the 16 ymm registers hold accumulators for.
// Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <cstdint>

#include "ember/bf16.h"
#include "skinny/skinny_kernels.h"
#include "skinny/skinny_matmul.h"

namespace ember::skinny::kernels {
namespace {

struct Avx2Dot {
  using Vec = __m256;
  using Acc = __m256;
  static constexpr int kStep = 8;
  static constexpr int kRegisters = 16;
  static Acc zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static Acc madd(Acc acc, Vec w, Vec x) { return _mm256_fmadd_ps(w, x, acc); }
  static float sum(Acc acc) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
};

// clang-format off
#include "skinny/skinny_body.inl"
// clang-format on
}  // namespace

template <typename S>
void dot_rows_avx2(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                   float* y, int64_t ldy) {
  dot_rows_any<Avx2Dot, S>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}
template void dot_rows_avx2<float>(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                   float*, int64_t);
template void dot_rows_avx2<uint16_t>(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                                      int64_t, float*, int64_t);

}  // namespace ember::skinny::kernels
