// A few rows of x against the packed copy of w (tile_matmul.h's PackedLayout) on vdpbf16ps: the decoder of an
// encoder-decoder model at batch 1, a decoded token. The layout is the one vdpbf16ps wants as it lies: a row of a
// packed step is 16 columns' (k, k + 1) pairs, one 32-bit lane each, so each 64-byte load of w meets the same pair of
// every row of x broadcast, and w streams through once. oneDNN's matmul spent ~25 us on a 4 x 384 x 384 call on the
// 16-core Xeon (Whisper's decoder: 28 such calls a forward), most of it set-up around a few microseconds of loads.
// Compiled with the AVX512-BF16 flags (the file's suffix).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "tile_matmul/tile_matmul_kernels.h"

namespace ember::tile_matmul::kernels {
namespace {

constexpr int64_t kGroup = kFewRowGroupCols;
constexpr int64_t kStep = 32;  // k of one packed step (16 pairs)

// Pair `pair` of x's row (its elements 2·pair and 2·pair + 1) as one 32-bit lane, the high half zero past the row's
// k (an odd k's last pair: the packed copy's padding is zero, and x's element past the row is never read).
inline uint32_t pair_bits(const uint16_t* row, int64_t pair, int64_t k) {
  const int64_t at = 2 * pair;
  uint32_t bits = 0;
  if (at + 1 < k) {
    std::memcpy(&bits, row + at, sizeof bits);
  } else {
    bits = row[at];
  }
  return bits;
}

// Where column group g (16 columns) starts in the packed copy: its block, and its offset inside each pair row.
inline const uint16_t* group_base(const uint16_t* packed, const PackedLayout& layout, int64_t g) {
  const int64_t col = g * kGroup, width = layout.block_cols;
  return packed + (col / width) * layout.steps() * kStep * width + (col % width) * 2;
}

// sums[i][c - col0] for rows i < M and the G groups from g0: every k pair of x against the groups' pair rows.
template <int M, int G>
void few_rows_groups(const uint16_t* x, int64_t ldx, const uint16_t* packed, const PackedLayout& layout, int64_t g0,
                     float* sums, int64_t ld, int64_t col0) {
  const int64_t pairs = (layout.k + 1) / 2, width = layout.block_cols;
  const uint16_t* base[G];
  for (int g = 0; g < G; ++g) base[g] = group_base(packed, layout, g0 + g);
  __m512 acc[M][G];
  for (int i = 0; i < M; ++i) {
    for (int g = 0; g < G; ++g) acc[i][g] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    // Pair p lies in step p / 16, at row p % 16 of the step's 16 pair rows (each `width` columns of pairs).
    const int64_t offset = (p / 16) * kStep * width + (p % 16) * 2 * width;
    __m512bh w[G];
    for (int g = 0; g < G; ++g) w[g] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(base[g] + offset));
    for (int i = 0; i < M; ++i) {
      const auto xp =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair_bits(x + i * ldx, p, layout.k))));
      for (int g = 0; g < G; ++g) acc[i][g] = _mm512_dpbf16_ps(acc[i][g], xp, w[g]);
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(sums + i * ld + (g0 + g) * kGroup - col0, acc[i][g]);
  }
}

// Sums for every row against groups [g0, g1): G groups at a time while they last, then the rest in halving runs (a
// thread's share of a 384-column layer is 12 groups: one run of 8 and one of 4, not 4 single groups). G keeps M·G
// sums in registers (16 of the 32), beside the G weight vectors.
template <int M, int G>
void few_rows_runs(const uint16_t* x, int64_t ldx, const uint16_t* packed, const PackedLayout& layout, int64_t g0,
                   int64_t g1, float* sums, int64_t ld, int64_t col0) {
  int64_t g = g0;
  for (; g + G <= g1; g += G) few_rows_groups<M, G>(x, ldx, packed, layout, g, sums, ld, col0);
  if constexpr (G > 1) few_rows_runs<M, G / 2>(x, ldx, packed, layout, g, g1, sums, ld, col0);
}

template <int M>
void few_rows_m(const uint16_t* x, int64_t ldx, const uint16_t* packed, const PackedLayout& layout, int64_t g0,
                int64_t g1, float* sums, int64_t ld, int64_t col0) {
  few_rows_runs<M, M <= 2 ? 8 : 4>(x, ldx, packed, layout, g0, g1, sums, ld, col0);
}

}  // namespace

void few_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* packed, const PackedLayout& layout,
                          int64_t g0, int64_t g1, float* sums, int64_t ld, int64_t col0) {
  switch (m) {
    case 1: few_rows_m<1>(x, ldx, packed, layout, g0, g1, sums, ld, col0); break;
    case 2: few_rows_m<2>(x, ldx, packed, layout, g0, g1, sums, ld, col0); break;
    case 3: few_rows_m<3>(x, ldx, packed, layout, g0, g1, sums, ld, col0); break;
    default: few_rows_m<4>(x, ldx, packed, layout, g0, g1, sums, ld, col0); break;
  }
}

}  // namespace ember::tile_matmul::kernels
