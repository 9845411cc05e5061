// Skinny matmul, AMX path (bf16). A tile multiply (tdpbf16ps) takes 16 rows of w by 32 elements of k straight
// from memory as its A tile, so the weight is still read where it lies, and multiplies it against up to 16 rows
// of x at once: 16·32·m multiply-adds per instruction against vdpbf16ps's 32, which keeps the kernel at the
// weight's streaming speed at a few rows, where the vector paths become compute-bound.
//
// Tiles: 0 and 1 hold the sums (C) of two 16-row blocks of w, loaded into 4 and 5 (A), against rows 0-15 of the
// packed x in 6 (B); from 17 rows of x, 2 and 3 hold the same blocks against rows 16-31 in 7. Each A tile is used
// against every B tile of its k step, so the weight is read once for up to 32 rows. Measured on the Xeon and set
// aside: four blocks in flight ran no faster on cache-resident weights and 1.5-2x slower on weights streamed from
// memory (64 rows of w read at once are more streams than a core's prefetchers follow).
// Products are exact in fp32 and summed in fp32; like vdpbf16ps, the tile multiply treats denormal inputs and
// results as zero. Compiled with the AVX-512 flags plus -mavx512bf16 -mamx-tile -mamx-bf16.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ember/bf16.h"
#include "skinny/skinny_kernels.h"

namespace ember::skinny::kernels {
namespace {

constexpr int64_t kBlock = 16;  // rows of w in an A tile, and of a C tile

// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
#include "simd/amx_tiles.inl"
// clang-format on

// x's rows 0-15 go to the first B tile, 16-31 to the second (and so to C tiles 0-1 and 2-3).
constexpr int64_t kHalf = kAmxTileRows;

// Tiles 0 and 1: C of w blocks 0 and 1 against x rows 0-15; 2 and 3: the same against x rows 16-31 (m > 16 only);
// 4 and 5: A, the two blocks of w; 6 and 7: B, the two halves of the packed x.
TileConfig config_for(int64_t m) {
  TileConfig c;
  const auto set = [&c](int tile, int64_t bytes_per_row) {
    c.rows[tile] = static_cast<uint8_t>(kBlock);
    c.colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  };
  const int64_t first = std::min(m, kHalf), second = m - first;
  for (int tile : {0, 1, 6}) set(tile, first * 4);  // a column per row of x
  if (second > 0) {
    for (int tile : {2, 3, 7}) set(tile, second * 4);
  }
  for (int tile : {4, 5}) set(tile, kAmxStep * 2);
  return c;
}

// Sums of one pass: [block][half of x][row of w][row of x within the half].
constexpr int kMaxBlocks = 2;
using PassSums = float[kMaxBlocks][2][kBlock][kHalf];
constexpr int64_t kSumsStride = kHalf * sizeof(float);

// `Blocks` 16-row blocks of w against the packed x, in `Halves` B tiles. The tile instructions name their tiles in
// the opcode, so both counts are template parameters and each tile a literal. Each A tile is loaded once a k step
// and used against both halves of x, so the weight is still read once.
template <int Blocks, int Halves>
void pass(const uint32_t* packed, int64_t m, const uint16_t* w, int64_t ldw, int64_t k32, PassSums& sums) {
  static_assert(Blocks >= 1 && Blocks <= kMaxBlocks && Halves >= 1 && Halves <= 2, "C tiles 0-3");
  const int64_t pstride = m * 4, wstride = ldw * 2;
  _tile_zero(0);
  if constexpr (Blocks > 1) _tile_zero(1);
  if constexpr (Halves > 1) {
    _tile_zero(2);
    if constexpr (Blocks > 1) _tile_zero(3);
  }
  for (int64_t kk = 0; kk < k32; kk += kAmxStep) {
    const uint32_t* row = packed + (kk / 2) * m;
    _tile_loadd(6, row, pstride);
    if constexpr (Halves > 1) _tile_loadd(7, row + kHalf, pstride);
    _tile_loadd(4, w + kk, wstride);
    if constexpr (Blocks > 1) _tile_loadd(5, w + kBlock * ldw + kk, wstride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Halves > 1) _tile_dpbf16ps(2, 4, 7);
    if constexpr (Blocks > 1) _tile_dpbf16ps(1, 5, 6);
    if constexpr (Blocks > 1 && Halves > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, &sums[0][0][0][0], kSumsStride);
  if constexpr (Blocks > 1) _tile_stored(1, &sums[1][0][0][0], kSumsStride);
  if constexpr (Halves > 1) {
    _tile_stored(2, &sums[0][1][0][0], kSumsStride);
    if constexpr (Blocks > 1) _tile_stored(3, &sums[1][1][0][0], kSumsStride);
  }
}

template <int Halves>
void pass_blocks(int64_t blocks, const uint32_t* packed, int64_t m, const uint16_t* w, int64_t ldw, int64_t k32,
                 PassSums& sums) {
  blocks == 2 ? pass<2, Halves>(packed, m, w, ldw, k32, sums) : pass<1, Halves>(packed, m, w, ldw, k32, sums);
}

// y[i][j + b·16 + r] = sums[b][i / 16][r][i % 16] + the products of k's tail, for `blocks` blocks of w from row w
// (y's column j). The C tiles hold a row of w per tile row, y wants a row of x per row: each 16x16 block is
// transposed in registers.
void store(const PassSums& sums, int64_t blocks, const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w,
           int64_t ldw, int64_t k32, int64_t k, float* y, int64_t ldy) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t h = 0; h * kHalf < m; ++h) {
      __m512 rows[16];
      for (int r = 0; r < 16; ++r) rows[r] = _mm512_load_ps(&sums[b][h][r][0]);
      Avx512F::transpose(rows);
      const int64_t count = std::min(kHalf, m - h * kHalf);
      for (int64_t i = 0; i < count; ++i) _mm512_storeu_ps(y + (h * kHalf + i) * ldy + b * kBlock, rows[i]);
    }
    if (k32 == k) continue;
    for (int64_t r = 0; r < kBlock; ++r) {
      const uint16_t* wr = w + (b * kBlock + r) * ldw;
      for (int64_t i = 0; i < m; ++i) {
        float tail = 0.0f;
        for (int64_t t = k32; t < k; ++t) tail += bf16::widen(wr[t]) * bf16::widen(x[i * ldx + t]);
        y[i * ldy + b * kBlock + r] += tail;
      }
    }
  }
}

}  // namespace

void dot_rows_amx(const uint16_t* x, int64_t ldx, const uint32_t* packed, int64_t m, const uint16_t* w, int64_t ldw,
                  int64_t k, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t k32 = k - k % kAmxStep;
  const int64_t blocks = (n1 - n0) / kBlock;
  if (blocks > 0) {
    const TileConfig config = config_for(m);
    load_config(config);
    // Zeroed once: the tile stores write min(m, 16) or m - 16 columns a row, the transpose reads all 16.
    alignas(64) PassSums sums = {};
    for (int64_t b = 0; b < blocks;) {
      const int64_t count = std::min<int64_t>(kMaxBlocks, blocks - b);
      const uint16_t* wb = w + (n0 + b * kBlock) * ldw;
      m > kHalf ? pass_blocks<2>(count, packed, m, wb, ldw, k32, sums)
                : pass_blocks<1>(count, packed, m, wb, ldw, k32, sums);
      store(sums, count, x, ldx, m, wb, ldw, k32, k, y + b * kBlock, ldy);
      b += count;
    }
    _tile_release();  // the initial tile state, which a context switch's XSAVE then skips
  }
  const int64_t rest = n0 + blocks * kBlock;
  if (rest < n1) {
    // At most 15 rows, always the last of w: chunks of the split start at multiples of 16 rows.
    dot_rows_avx512_bf16(x, ldx, m, w, ldw, k, rest, n1, y + blocks * kBlock, ldy);
  }
}

}  // namespace ember::skinny::kernels
