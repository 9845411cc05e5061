// AVX-512 bf16 conversions: 16 elements per vector, tails through masked loads and stores, so there is no
// scalar loop. vpmovdw (cvtepi32_epi16) narrows 32-bit lanes by truncation, which is exactly "take the low 16
// bits". Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; internal to this file (see bf16_kernels.h).
#include <immintrin.h>

#include "bf16_kernels.h"

namespace ember::bf16::kernels {
namespace {

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1U << remaining) - 1U);
}

// fp32 -> bf16 bits in the low half of each lane, round to nearest even; NaN quieted, sign and payload kept.
inline __m512i round_vec(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(rounded, is_nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
}

}  // namespace

void split_avx512(const float* src, uint16_t* top, uint16_t* bottom, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i bits = _mm512_maskz_loadu_epi32(m, src + i);
    _mm512_mask_cvtepi32_storeu_epi16(top + i, m, _mm512_srli_epi32(bits, 16));
    _mm512_mask_cvtepi32_storeu_epi16(bottom + i, m, bits);
  }
}

void join_avx512(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i t = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, top + i));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bottom + i));
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_or_si512(_mm512_slli_epi32(t, 16), b));
  }
}

void round_avx512(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, round_vec(_mm512_maskz_loadu_epi32(m, src + i)));
  }
}

}  // namespace ember::bf16::kernels
