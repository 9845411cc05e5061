// AVX2 bf16 conversions: 16 elements per iteration, integer arithmetic on the fp32 bit patterns.
// Compiled with -mavx2 -mfma -mf16c; everything here is internal to this file (see bf16_kernels.h).
//
// With `stream`, outputs are written with non-temporal stores: for arrays larger than the cache they skip the
// read-for-ownership of each output line (a third of round's traffic, half of split's writes) and leave the
// cache to the data that is still wanted. Streaming stores need 32-byte aligned addresses, so a scalar head runs
// until the output is aligned.
#include <immintrin.h>

#include <cstdint>

#include "bf16_kernels.h"

namespace ember::bf16::kernels {
namespace {

inline uint32_t load_bits(const float* p) {
  uint32_t bits;
  __builtin_memcpy(&bits, p, sizeof bits);
  return bits;
}

inline uint16_t round_scalar(uint32_t bits) {
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((bits >> 16) | 0x0040U);
  return static_cast<uint16_t>((bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16);
}

inline bool aligned32(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 31U) == 0; }

// Elements of 16-bit output to write one at a time before `p` is 32-byte aligned (at most 15, 0 if it can't be).
inline int64_t head_u16(const uint16_t* p, int64_t n) {
  const auto misalign = reinterpret_cast<uintptr_t>(p) & 31U;
  if (misalign == 0 || (misalign & 1U) != 0) return 0;
  const int64_t head = static_cast<int64_t>((32U - misalign) / 2U);
  return head < n ? head : n;
}

template <bool kStream>
inline void store(__m256i* p, __m256i v) {
  if constexpr (kStream) {
    _mm256_stream_si256(p, v);
  } else {
    _mm256_storeu_si256(p, v);
  }
}

// Packs the low 16 bits of each 32-bit lane of a (elements 0-7) and b (8-15) into 16 uint16 in order. packus
// works within 128-bit lanes, so the 64-bit quarters come out as a0 b0 a1 b1 and are put back in order.
inline __m256i pack_low16(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8); }

// fp32 -> bf16 bits, round to nearest even; NaN keeps sign and top payload with the quiet bit set.
inline __m256i round_vec(__m256i bits) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

template <bool kStream>
void split_body(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, int64_t i) {
  const __m256i low_mask = _mm256_set1_epi32(0xFFFF);
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8));
    store<kStream>(reinterpret_cast<__m256i*>(top + i), pack_low16(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16)));
    store<kStream>(reinterpret_cast<__m256i*>(bottom + i),
                   pack_low16(_mm256_and_si256(a, low_mask), _mm256_and_si256(b, low_mask)));
  }
  for (; i < n; ++i) {
    const uint32_t bits = load_bits(src + i);
    top[i] = static_cast<uint16_t>(bits >> 16);
    bottom[i] = static_cast<uint16_t>(bits & 0xFFFFU);
  }
}

template <bool kStream>
void join_body(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, int64_t i) {
  for (; i + 16 <= n; i += 16) {
    const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(top + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bottom + i));
    // unpack interleaves within 128-bit lanes: lo holds elements 0-3 and 8-11, hi 4-7 and 12-15.
    const __m256i lo = _mm256_unpacklo_epi16(b, t);
    const __m256i hi = _mm256_unpackhi_epi16(b, t);
    store<kStream>(reinterpret_cast<__m256i*>(dst + i), _mm256_permute2x128_si256(lo, hi, 0x20));
    store<kStream>(reinterpret_cast<__m256i*>(dst + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  }
  for (; i < n; ++i) {
    const uint32_t bits = (static_cast<uint32_t>(top[i]) << 16) | bottom[i];
    __builtin_memcpy(dst + i, &bits, sizeof bits);
  }
}

template <bool kStream>
void round_body(const float* src, uint16_t* dst, int64_t n, int64_t i) {
  // 32 elements per iteration: each pair of stores fills one whole 64-byte output line, which lets the
  // write-combining buffer go out as one full-line write when streaming.
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 16));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 24));
    store<kStream>(reinterpret_cast<__m256i*>(dst + i), pack_low16(round_vec(a), round_vec(b)));
    store<kStream>(reinterpret_cast<__m256i*>(dst + i + 16), pack_low16(round_vec(c), round_vec(d)));
  }
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8));
    store<kStream>(reinterpret_cast<__m256i*>(dst + i), pack_low16(round_vec(a), round_vec(b)));
  }
  for (; i < n; ++i) dst[i] = round_scalar(load_bits(src + i));
}

}  // namespace

void split_avx2(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream) {
  const int64_t head = stream ? head_u16(top, n) : 0;
  split_body<false>(src, top, bottom, head, 0);
  if (stream && aligned32(top + head) && aligned32(bottom + head)) {
    split_body<true>(src, top, bottom, n, head);
    _mm_sfence();
  } else {
    split_body<false>(src, top, bottom, n, head);
  }
}

void join_avx2(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream) {
  int64_t head = 0;
  if (stream && (reinterpret_cast<uintptr_t>(dst) & 3U) == 0) {
    while (head < n && !aligned32(dst + head)) ++head;
  }
  join_body<false>(top, bottom, dst, head, 0);
  if (stream && aligned32(dst + head)) {
    join_body<true>(top, bottom, dst, n, head);
    _mm_sfence();
  } else {
    join_body<false>(top, bottom, dst, n, head);
  }
}

void round_avx2(const float* src, uint16_t* dst, int64_t n, bool stream) {
  const int64_t head = stream ? head_u16(dst, n) : 0;
  round_body<false>(src, dst, head, 0);
  if (stream && aligned32(dst + head)) {
    round_body<true>(src, dst, n, head);
    _mm_sfence();
  } else {
    round_body<false>(src, dst, n, head);
  }
}

}  // namespace ember::bf16::kernels
