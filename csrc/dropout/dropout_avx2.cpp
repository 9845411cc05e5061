// Dropout, AVX2 path: eight Philox blocks per ymm register, a tile of 64 elements in two halves. AVX2 multiplies
// only the even 32-bit lanes to 64 bits (vpmuludq), so each round multiplies twice (even lanes, then the odd ones
// shifted down) and blends the halves back. Compiled with -mavx2 -mfma -mf16c; internal to this file.
#include <immintrin.h>

#include <cstdint>

#include "dropout_kernels.h"
#include "ember/philox.h"  // the constants only (see there)

namespace ember::dropout::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
// clang-format on

struct Avx2Words {
  using Words = __m256i;
  static Words broadcast(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }

  // hi and lo halves of the 64-bit products a * m, lane by lane (m the same in every lane).
  static void mulhilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(a, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }

  static void counters(uint64_t first, Words& lo, Words& hi) {
    const auto first_lo = static_cast<uint32_t>(first);
    if (first_lo <= UINT32_MAX - 7) {  // the common case: no lane carries into the high word
      lo = _mm256_add_epi32(broadcast(first_lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      hi = broadcast(static_cast<uint32_t>(first >> 32));
    } else {
      alignas(32) uint32_t lo_words[8], hi_words[8];
      for (int l = 0; l < 8; ++l) {
        lo_words[l] = static_cast<uint32_t>(first + l);
        hi_words[l] = static_cast<uint32_t>((first + l) >> 32);
      }
      lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_words));
      hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_words));
    }
  }

  static Words xor3(Words a, Words b, Words c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }

  static __m256 factor(Words word, Words threshold, __m256 scale) {
    // word >= threshold, unsigned: AVX2 has no unsigned compare, but max(word, threshold) == word says it.
    const __m256i keep = _mm256_cmpeq_epi32(_mm256_max_epu32(word, threshold), word);
    return _mm256_and_ps(_mm256_castsi256_ps(keep), scale);
  }
  static void lanes(Words word, uint32_t* out) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), word); }
};

// clang-format off
#include "dropout_body.inl"
// clang-format on
}  // namespace

template <typename S>
void apply_avx2(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  dropout_range<Avx2F, Avx2Words, S>(x, y, begin, end, seed, threshold, scale);
}
template void apply_avx2<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void apply_avx2<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
