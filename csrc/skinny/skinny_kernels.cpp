// The skinny matmul's dot kernels for one ISA (skinny_body.inl over the ISA's "Dot": how many fp32 partial sums a
// register holds and how a k step multiplies): compiled once per ISA by ember_kernel_family (CMakeLists.txt). The
// avx512_bf16 compilation has a bf16-only kernel on vdpbf16ps instead; AMX has code of its own (skinny_amx.cpp).
#include <cstdint>

#include "ember/bf16.h"
#include "simd/kernel_isa.h"
#include "skinny/skinny_kernels.h"
#include "skinny/skinny_matmul.h"

namespace ember::skinny::kernels {
namespace {
// clang-format off
#include "simd/kernel_simd.inl"
// clang-format on

#if EMBER_KERNEL_LEVEL == 3
// vdpbf16ps multiplies 32 bf16 pairs and adds each pair's two products to one of sixteen fp32 lanes, so a k step is
// 32 elements read as they lie, with no widening. The products are exact in fp32; the instruction treats denormal
// inputs and results as zero (Intel SDM, VDPBF16PS), which a trained weight or activation essentially never is.
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
using Dot = Avx512Bf16Dot;
#elif EMBER_KERNEL_LEVEL == 2
// Sixteen fp32 lanes of partial sums per (row of x, row of w), bf16 widened to fp32 by a shift on load; as many
// rows of w in flight as the 32 zmm registers hold accumulators for.
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
using Dot = Avx512Dot;
#elif EMBER_KERNEL_LEVEL == 1
// Eight fp32 lanes of partial sums per (row of x, row of w), bf16 widened by a shift on load; as many rows of w in
// flight as the 16 ymm registers hold accumulators for.
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
using Dot = Avx2Dot;
#else
// The reference: one fp32 accumulator per output, k summed in order; the oracle the vector paths are tested against
// (besides float64).
struct RefDot {
  using Vec = float;
  using Acc = float;
  static constexpr int kStep = 1;
  static constexpr int kRegisters = 0;
  static Acc zero() { return 0.0f; }
  static Vec load(const float* p) { return *p; }
  static Vec load(const uint16_t* p) { return bf16::widen(*p); }
  static Acc madd(Acc acc, Vec w, Vec x) { return acc + w * x; }
  static float sum(Acc acc) { return acc; }
};
using Dot = RefDot;
#endif

// clang-format off
#include "skinny/skinny_body.inl"
// clang-format on
}  // namespace

#if EMBER_KERNEL_LEVEL == 3
void dot_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                          int64_t n0, int64_t n1, float* y, int64_t ldy) {
  dot_rows_any<Dot, uint16_t>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}
#else
template <typename S>
void EMBER_KERNEL(dot_rows)(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0,
                            int64_t n1, float* y, int64_t ldy) {
  dot_rows_any<Dot, S>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}
template void EMBER_KERNEL(dot_rows)<float>(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t,
                                            int64_t, float*, int64_t);
template void EMBER_KERNEL(dot_rows)<uint16_t>(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t,
                                               int64_t, int64_t, float*, int64_t);
#endif

}  // namespace ember::skinny::kernels
