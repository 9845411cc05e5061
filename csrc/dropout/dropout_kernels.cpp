// Dropout's kernel for one ISA: compiled once per ISA by ember_kernel_family (CMakeLists.txt). The arithmetic is
// dropout_body.inl's; what differs by ISA is how many Philox blocks a register holds, below ("Words").
#include <cstdint>

#include "dropout_kernels.h"
#include "ember/philox.h"  // the constants only (see there)
#include "simd/kernel_isa.h"

namespace ember::dropout::kernels {
namespace {
// clang-format off
#include "simd/kernel_simd.inl"
// clang-format on

#if EMBER_KERNEL_LEVEL >= 2
// AVX-512: the sixteen Philox blocks of a tile in one zmm register, each of the four words it gives back sixteen
// consecutive elements. vpmuludq multiplies the even 32-bit lanes only, so each round multiplies twice (even
// lanes, then the odd ones shifted down) and blends the halves back under a mask.
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
using VecWords = Avx512Words;
#elif EMBER_KERNEL_LEVEL == 1
// Dropout, AVX2 path: eight Philox blocks per ymm register, a tile of 64 elements in two halves. AVX2 multiplies
// only the even 32-bit lanes to 64 bits (vpmuludq), so each round multiplies twice (even lanes, then the odd ones
// shifted down) and blends the halves back. Compiled with -mavx2 -mfma -mf16c; internal to this file.
// clang-format off
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
using VecWords = Avx2Words;
#else
// Reference: one Philox block at a time, in plain 32- and 64-bit integer arithmetic.
struct ScalarWords {
  using Words = uint32_t;
  static Words broadcast(uint32_t x) { return x; }
  static void counters(uint64_t first, Words& lo, Words& hi) {
    lo = static_cast<uint32_t>(first);
    hi = static_cast<uint32_t>(first >> 32);
  }
  static void mulhilo(Words a, Words m, Words& hi, Words& lo) {
    const uint64_t product = static_cast<uint64_t>(a) * m;
    hi = static_cast<uint32_t>(product >> 32);
    lo = static_cast<uint32_t>(product);
  }
  static Words xor3(Words a, Words b, Words c) { return a ^ b ^ c; }
  static float factor(Words word, Words threshold, float scale) { return word >= threshold ? scale : 0.0f; }
  static void lanes(Words word, uint32_t* out) { out[0] = word; }
};
using VecWords = ScalarWords;
#endif

// clang-format off
#include "dropout_body.inl"
// clang-format on
}  // namespace

template <typename S>
void EMBER_KERNEL(apply)(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  dropout_range<VecF, VecWords, S>(x, y, begin, end, seed, threshold, scale);
}
template void EMBER_KERNEL(apply)<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void EMBER_KERNEL(apply)<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
