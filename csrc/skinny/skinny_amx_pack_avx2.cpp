// Lays the rows of x out as AMX B tiles (skinny_kernels.h, pack_rows_for_amx): a transpose of x read as 32-bit
// words (pairs of bf16), done in 8x8 blocks in AVX2 registers. Each thread runs it once per call, into its own
// buffer, over the m·k elements of x (a few percent of the time the tiles then spend on its slice of w). Compiled with
// -mavx2 -mfma -mf16c, so the tests check it on any AVX2 machine, not only where AMX runs.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "skinny/skinny_kernels.h"

namespace ember::skinny::kernels {
namespace {

// r[i] = row i of an 8x8 block of words in, column i out.
void transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);          // a0 b0 c0 d0 | a4 b4 c4 d4
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);      // a1 b1 c1 d1 | a5 b5 c5 d5
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);  // a2 b2 c2 d2 | a6 b6 c6 d6
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);  // a3 b3 c3 d3 | a7 b7 c7 d7
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);      // low halves: column j
    r[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);  // high halves: column j + 4
  }
}

}  // namespace

void pack_rows_for_amx(const uint16_t* x, int64_t ldx, int64_t m, int64_t k32, uint32_t* packed) {
  for (int64_t i0 = 0; i0 < m; i0 += 8) {
    // Columns i0..i0 + width of each packed row.
    const int width = static_cast<int>(std::min<int64_t>(8, m - i0));
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i store_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(width), lanes);
    for (int64_t r0 = 0; r0 < k32 / 2; r0 += 8) {  // k32 / 2 is a multiple of 16
      __m256i block[8];
      for (int i = 0; i < 8; ++i) {
        block[i] = i0 + i < m ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + (i0 + i) * ldx + 2 * r0))
                              : _mm256_setzero_si256();
      }
      transpose8x8(block);
      for (int r = 0; r < 8; ++r) {
        _mm256_maskstore_epi32(reinterpret_cast<int*>(packed + (r0 + r) * m + i0), store_mask, block[r]);
      }
    }
  }
}

}  // namespace ember::skinny::kernels
