// Dot interaction, AVX512-BF16 forward (bfloat16 only). vdpbf16ps multiplies 32 bf16 pairs and adds each pair's two
// products into one of sixteen fp32 lanes, so a row is read as it lies, 32 elements an instruction, with no
// widening into a scratch block; the products are exact in fp32, sums stay in fp32 and each dot is rounded to
// bf16 once. The instruction treats denormal inputs as zero (Intel SDM, VDPBF16PS). One row x is dotted with four
// rows at a time and the four accumulators are summed together (hsum4), not one horizontal sum per pair.
// Compiled with the AVX-512 flags plus -mavx512bf16.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "interaction_kernels.h"
#include "simd/local_vector.h"

namespace ember::interaction::kernels {
namespace {

using Bf16x32 = __m512bh;

inline Bf16x32 load(const uint16_t* p) { return (Bf16x32)_mm512_loadu_si512(p); }
inline Bf16x32 load(const uint16_t* p, __mmask32 m) { return (Bf16x32)_mm512_maskz_loadu_epi16(m, p); }

// {sum of a0's lanes, a1's, a2's, a3's}.
inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Per 128-bit lane: [a0 a1 a0 a1] and [a2 a3 a2 a3] partial sums, then [a0 a1 a2 a3].
  const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23));
  const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23));
  const __m512 u = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  // The four 128-bit lanes added together.
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(u), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The dots of row x with rows y[0..K), K = 4 or 1, into out[0..K).
template <int K>
inline void dots(const uint16_t* x, const uint16_t* const* y, int64_t dim, __mmask32 tail, float* out) {
  __m512 acc[K];
  for (int k = 0; k < K; ++k) acc[k] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= dim; c += 32) {
    const Bf16x32 xc = load(x + c);
    for (int k = 0; k < K; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], xc, load(y[k] + c));
  }
  if (c < dim) {  // the zeroed lanes of a masked load add nothing
    const Bf16x32 xc = load(x + c, tail);
    for (int k = 0; k < K; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], xc, load(y[k] + c, tail));
  }
  if constexpr (K == 4) {
    _mm_storeu_ps(out, hsum4(acc[0], acc[1], acc[2], acc[3]));
  } else {
    out[0] = _mm512_reduce_add_ps(acc[0]);
  }
}

// out[0..n) = z[0..n) rounded to bf16 (nearest even), sixteen at a time.
inline void round_into(const float* z, int64_t n, uint16_t* out) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1);
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, z + j));
    _mm256_mask_storeu_epi16(out + j, m, (__m256i)b);
  }
}

}  // namespace

void forward_avx512_bf16(const Args<uint16_t>& a, int64_t begin, int64_t end) {
  const int64_t rem = a.dim % 32;
  const __mmask32 tail = rem == 0 ? __mmask32(0) : __mmask32((uint64_t{1} << rem) - 1);
  simd::LocalVector<const uint16_t*> rows(static_cast<size_t>(a.n));
  simd::LocalVector<float> z(static_cast<size_t>(a.n));
  for (int64_t b = begin; b < end; ++b) {
    uint16_t* out = a.out + b * a.width;
    // (width 0: an empty tensor's data may be null, and memcpy from null is undefined even for 0 bytes)
    if (a.dim > 0) std::memcpy(out, a.inputs[0] + b * a.dim, static_cast<size_t>(a.dim) * sizeof(uint16_t));
    for (int i = 0; i < a.n; ++i) rows[i] = a.inputs[i] + b * a.dim;
    uint16_t* tri = out + a.dim;
    for (int i = 1; i < a.n; ++i) {
      int j = 0;
      for (; j + 4 <= i; j += 4) dots<4>(rows[i], rows.data() + j, a.dim, tail, z.data() + j);
      for (; j < i; ++j) dots<1>(rows[i], rows.data() + j, a.dim, tail, z.data() + j);
      round_into(z.data(), i, tri);
      tri += i;
    }
  }
}

}  // namespace ember::interaction::kernels
