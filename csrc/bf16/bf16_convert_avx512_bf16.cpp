// AVX512-BF16 rounding: vcvtneps2bf16 converts 16 floats with round to nearest even and quiets NaNs the way
// round_bits() does, but it treats denormal inputs as zero (Intel SDM, VCVTNEPS2BF16). ember rounds denormals
// like torch does, so lanes holding a denormal (rare: a vfpclassps test per vector) are redone with the integer
// rounding of the AVX-512 path. Compiled with the AVX-512 flags plus -mavx512bf16.
#include <cstdint>

#include <immintrin.h>

#include "bf16_kernels.h"

namespace ember::bf16::kernels {
namespace {

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1U << remaining) - 1U);
}

inline __m256i round_denormals(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_cvtepi32_epi16(rounded);
}

constexpr int kDenormalClass = 0x20;  // vfpclassps imm8 bit 5: denormal

template <bool kStream>
void round_range(const float* src, uint16_t* dst, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = tail_mask(end - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    const __m256bh converted = _mm512_cvtneps_pbh(x);
    __m256i out;
    __builtin_memcpy(&out, &converted, sizeof out);
    const __mmask16 denormal = _mm512_fpclass_ps_mask(x, kDenormalClass);
    if (denormal != 0) {
      out = _mm256_mask_blend_epi16(denormal, out, round_denormals(_mm512_castps_si512(x)));
    }
    if (kStream && m == 0xFFFF) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), out);
    } else {
      _mm256_mask_storeu_epi16(dst + i, m, out);
    }
  }
}

}  // namespace

void round_avx512_bf16(const float* src, uint16_t* dst, int64_t n, bool stream) {
  // Non-temporal stores once dst is 32-byte aligned (see bf16_convert_avx2.cpp for why).
  int64_t head = 0;
  const auto misalign = reinterpret_cast<uintptr_t>(dst) & 31U;
  if (stream && misalign != 0 && misalign % 2 == 0) head = static_cast<int64_t>((32U - misalign) / 2U);
  if (head > n) head = n;
  round_range<false>(src, dst, 0, head);
  if (stream && (reinterpret_cast<uintptr_t>(dst + head) & 31U) == 0) {
    round_range<true>(src, dst, head, n);
    _mm_sfence();
  } else {
    round_range<false>(src, dst, head, n);
  }
}

}  // namespace ember::bf16::kernels
