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

struct Avx512Philox {
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

  // The key of each round, broadcast once a call (the loop then reads them as memory operands).
  struct Keys {
    Words k0[philox::kRounds], k1[philox::kRounds];
  };
  static Keys keys(uint32_t k0, uint32_t k1) {
    Keys keys;
    for (int round = 0; round < philox::kRounds; ++round) {
      keys.k0[round] = broadcast(k0);
      keys.k1[round] = broadcast(k1);
      k0 += philox::kW0;
      k1 += philox::kW1;
    }
    return keys;
  }

  static void blocks(uint64_t first, const Keys& keys, Words out[4]) {
    __m512i c0, c1;
    const auto first_lo = static_cast<uint32_t>(first);
    if (first_lo <= UINT32_MAX - 15) {  // the common case: no lane carries into the high word
      c0 = _mm512_add_epi32(broadcast(first_lo),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      c1 = broadcast(static_cast<uint32_t>(first >> 32));
    } else {
      alignas(64) uint32_t lo[16], hi[16];
      for (int l = 0; l < 16; ++l) {
        lo[l] = static_cast<uint32_t>(first + l);
        hi[l] = static_cast<uint32_t>((first + l) >> 32);
      }
      c0 = _mm512_load_si512(lo);
      c1 = _mm512_load_si512(hi);
    }
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    const __m512i m0 = broadcast(philox::kM0), m1 = broadcast(philox::kM1);
    for (int round = 0; round < philox::kRounds; ++round) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo(c0, m0, hi0, lo0);
      mulhilo(c2, m1, hi1, lo1);
      // vpternlogd 0x96: a ^ b ^ c in one instruction.
      c0 = _mm512_ternarylogic_epi32(hi1, c1, keys.k0[round], 0x96);
      c1 = lo1;
      c2 = _mm512_ternarylogic_epi32(hi0, c3, keys.k1[round], 0x96);
      c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }

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
  dropout_range<Avx512F, Avx512Philox, S>(x, y, begin, end, seed, threshold, scale);
}
template void apply_avx512<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void apply_avx512<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
