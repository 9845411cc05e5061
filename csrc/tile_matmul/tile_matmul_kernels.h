// The bodies of the tile matmul (tile_matmul.h), compiled with the AMX flags in tile_matmul_amx.cpp, and of the
// few-row matmul on the same packed copy, compiled with the AVX512-BF16 flags in few_rows_avx512_bf16.cpp; the
// splits over threads and the epilogue are tile_matmul.cpp's.
#pragma once

#include <cstdint>

#include "tile_matmul/tile_matmul.h"

namespace ember::tile_matmul::kernels {

/// A unit of the split: a panel of 32 output columns (two B tiles) against a pair of 16-row blocks of x (32 rows).
inline constexpr int64_t kPanelCols = 32;
inline constexpr int64_t kPairRows = 32;
/// Multiplies units [u0, u1) of x [m, layout.k] (bf16, row stride ldx) by the packed weight, unit u being panel
/// u / ceil(m / 32) against row pair u % ceil(m / 32), and stores each unit's fp32 sums at sums[row · ld + column -
/// col0]: the caller's buffer spans the range's panels, from column col0, for all m rows. While it multiplies the
/// units of one panel it prefetches the next panel of the range into the cache.
void run_units_amx(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* packed, const PackedLayout& layout,
                   int64_t u0, int64_t u1, float* sums, int64_t ld, int64_t col0);

/// The columns of one few-row group: one vector of sums, a B tile's width.
inline constexpr int64_t kFewRowGroupCols = 16;
/// The few-row body (few_rows_avx512_bf16.cpp): the fp32 sums of x's m rows (1 to kMaxFewRows) against the
/// kFewRowGroupCols-column groups [g0, g1) of the packed weight, at sums[row · ld + column - col0].
void few_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* packed, const PackedLayout& layout,
                          int64_t g0, int64_t g1, float* sums, int64_t ld, int64_t col0);

}  // namespace ember::tile_matmul::kernels
