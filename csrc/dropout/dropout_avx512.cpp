// Dropout, AVX-512 path: the sixteen Philox blocks of a tile in one zmm register, each of the four words it gives
// back sixteen consecutive elements. vpmuludq multiplies the even 32-bit lanes only, so each round multiplies
// twice (even lanes, then the odd ones shifted down) and blends the halves back under a mask. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq; internal to this file.
#include <immintrin.h>

#include <cstdint>

#include "dropout_kernels.h"
#include "ember/philox.h"  // the constants only (see there)

namespace ember::dropout::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
// clang-format on

struct Avx512Words {
  using Words = __m512i;
  static constexpr __mmask16 kOdd = 0xAAAA;
  static Words broadcast(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }

  // hi and lo halves of the 64-bit products a * m, lane by lane (m the same in every lane).
  static void mulhilo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
    const __m512i even = _mm512_mul_epu32(a, m);
    const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    lo = _mm512_mask_blend_epi32(kOdd, even, _mm512_slli_epi64(odd, 32));
    hi = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even, 32), odd);
  }

  static void counters(uint64_t first, Words& lo, Words& hi) {
    const auto first_lo = static_cast<uint32_t>(first);
    if (first_lo <= UINT32_MAX - 15) {  // the common case: no lane carries into the high word
      lo = _mm512_add_epi32(broadcast(first_lo),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      hi = broadcast(static_cast<uint32_t>(first >> 32));
    } else {
      alignas(64) uint32_t lo_words[16], hi_words[16];
      for (int l = 0; l < 16; ++l) {
        lo_words[l] = static_cast<uint32_t>(first + l);
        hi_words[l] = static_cast<uint32_t>((first + l) >> 32);
      }
      lo = _mm512_load_si512(lo_words);
      hi = _mm512_load_si512(hi_words);
    }
  }

  // vpternlogd 0x96: a ^ b ^ c in one instruction.
  static Words xor3(Words a, Words b, Words c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }

  static __m512 factor(Words word, Words threshold, __m512 scale) {
    return _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(word, threshold), scale);
  }
  static void lanes(Words word, uint32_t* out) { _mm512_storeu_si512(out, word); }
};

// clang-format off
#include "dropout_body.inl"
// clang-format on
}  // namespace

template <typename S>
void apply_avx512(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  dropout_range<Avx512F, Avx512Words, S>(x, y, begin, end, seed, threshold, scale);
}
template void apply_avx512<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void apply_avx512<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
