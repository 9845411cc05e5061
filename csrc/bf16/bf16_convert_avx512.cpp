// AVX-512 bf16 conversions: 16 elements per vector, heads and tails through masked loads and stores, so there is
// no scalar loop. vpmovdw (cvtepi32_epi16) narrows 32-bit lanes by truncation, which is exactly "take the low 16
// bits". With `stream`, full vectors go out through non-temporal stores once the output is aligned (see
// bf16_convert_avx2.cpp for why). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; internal to this file.
#include <immintrin.h>

#include <cstdint>

#include "bf16_kernels.h"

namespace ember::bf16::kernels {
namespace {

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1U << remaining) - 1U);
}

// Elements before `p` reaches an `alignment`-byte boundary (0 when it never can, for an odd address).
inline int64_t head_elements(const void* p, unsigned elem_size, unsigned alignment, int64_t n) {
  const auto misalign = reinterpret_cast<uintptr_t>(p) & (alignment - 1U);
  if (misalign == 0 || misalign % elem_size != 0) return 0;
  const int64_t head = static_cast<int64_t>((alignment - misalign) / elem_size);
  return head < n ? head : n;
}

inline bool aligned(const void* p, unsigned alignment) {
  return (reinterpret_cast<uintptr_t>(p) & (alignment - 1U)) == 0;
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

// Writes 16 narrowed lanes: streamed when allowed and the vector is whole, masked otherwise.
template <bool kStream>
inline void store_u16(uint16_t* dst, __mmask16 m, __m512i lanes) {
  if (kStream && m == 0xFFFF) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(lanes));
  } else {
    _mm512_mask_cvtepi32_storeu_epi16(dst, m, lanes);
  }
}

template <bool kStream>
void split_range(const float* src, uint16_t* top, uint16_t* bottom, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = tail_mask(end - i);
    const __m512i bits = _mm512_maskz_loadu_epi32(m, src + i);
    store_u16<kStream>(top + i, m, _mm512_srli_epi32(bits, 16));
    store_u16<kStream>(bottom + i, m, bits);
  }
}

template <bool kStream>
void join_range(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = tail_mask(end - i);
    const __m512i t = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, top + i));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bottom + i));
    const __m512i joined = _mm512_or_si512(_mm512_slli_epi32(t, 16), b);
    if (kStream && m == 0xFFFF) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), joined);
    } else {
      _mm512_mask_storeu_epi32(dst + i, m, joined);
    }
  }
}

template <bool kStream>
void round_range(const float* src, uint16_t* dst, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = tail_mask(end - i);
    store_u16<kStream>(dst + i, m, round_vec(_mm512_maskz_loadu_epi32(m, src + i)));
  }
}

}  // namespace

void split_avx512(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream) {
  const int64_t head = stream ? head_elements(top, 2, 32, n) : 0;
  split_range<false>(src, top, bottom, 0, head);
  if (stream && aligned(top + head, 32) && aligned(bottom + head, 32)) {
    split_range<true>(src, top, bottom, head, n);
    _mm_sfence();
  } else {
    split_range<false>(src, top, bottom, head, n);
  }
}

void join_avx512(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream) {
  const int64_t head = stream ? head_elements(dst, 4, 64, n) : 0;
  join_range<false>(top, bottom, dst, 0, head);
  if (stream && aligned(dst + head, 64)) {
    join_range<true>(top, bottom, dst, head, n);
    _mm_sfence();
  } else {
    join_range<false>(top, bottom, dst, head, n);
  }
}

void round_avx512(const float* src, uint16_t* dst, int64_t n, bool stream) {
  const int64_t head = stream ? head_elements(dst, 2, 32, n) : 0;
  round_range<false>(src, dst, 0, head);
  if (stream && aligned(dst + head, 32)) {
    round_range<true>(src, dst, head, n);
    _mm_sfence();
  } else {
    round_range<false>(src, dst, head, n);
  }
}

}  // namespace ember::bf16::kernels
