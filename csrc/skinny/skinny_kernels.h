// Per-ISA bodies of the skinny matmul (skinny_matmul.h). Internal to ember_core: skinny_matmul.cpp picks one and
// runs it over slices of the weight's rows in parallel.
//
// Each computes y[i * ldy + j] = sum_k x[i * ldx + k] * w[(n0 + j) * ldw + k] in fp32 for i < m (any m >= 1, in
// groups of skinny::kMaxRows) and j < n1 - n0: rows of x against rows of w, both with unit stride along k. S is
// float for float32 and uint16_t for the bit patterns of bfloat16 (x and w have the same dtype). The sum runs over
// k in one fixed order, so its value does not depend on how the rows of w are split between threads.
#pragma once

#include <cstdint>

namespace ember::skinny::kernels {

template <typename S>
using DotRowsFn = void (*)(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0,
                           int64_t n1, float* y, int64_t ldy);

// One per ISA (skinny_kernels.cpp, compiled for each by ember_kernel_family).
#define EMBER_SKINNY_DECLARE_KERNELS(isa)                                                                             \
  template <typename S>                                                                                               \
  void dot_rows_##isa(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1, \
                      float* y, int64_t ldy);
EMBER_SKINNY_DECLARE_KERNELS(ref)
EMBER_SKINNY_DECLARE_KERNELS(avx2)
EMBER_SKINNY_DECLARE_KERNELS(avx512)
#undef EMBER_SKINNY_DECLARE_KERNELS
// bf16 only (skinny_kernels.cpp's avx512_bf16 compilation): vdpbf16ps multiplies pairs of bf16 and adds both
// products to fp32 lanes.
void dot_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                          int64_t n0, int64_t n1, float* y, int64_t ldy);

// The AMX path (bf16 only, skinny_amx.cpp). A tile multiply takes an A tile of 16 rows by 16 pairs of bf16 and a
// B tile of 16 pairs by up to 16 columns (two B tiles from 17 rows of x), laid out pair-interleaved ("VNNI"). The rows
// of w are A tiles as they lie in memory; x, the small operand, is re-laid by each thread into B tiles: word (r, i) of
// the packed x holds x[i][2r] and x[i][2r + 1]. k is taken in steps of kAmxStep; the rest (k % kAmxStep) is added in
// scalar fp32.
inline constexpr int64_t kAmxStep = 32;
/// Rows of x in one B tile (its columns); from kAmxTileRows + 1 rows the AMX path uses a second B tile.
inline constexpr int64_t kAmxTileRows = 16;
/// packed: [k32 / 2, m] words, m <= 32, for k32 a multiple of kAmxStep (skinny_amx_pack_avx2.cpp: AVX2 8x8
/// transposes of 32-bit words; every AMX CPU has AVX2).
void pack_rows_for_amx(const uint16_t* x, int64_t ldx, int64_t m, int64_t k32, uint32_t* packed);
/// dot_rows over m <= 32 rows: w's rows in whole 16-row blocks on AMX tiles against `packed` (x as packed by
/// pack_rows_for_amx for k32 = k rounded down to kAmxStep), the rest of the rows (n1 - n0 not a multiple of 16:
/// only the last rows of w, so which path computes a row does not depend on the split) on AVX512-BF16.
void dot_rows_amx(const uint16_t* x, int64_t ldx, const uint32_t* packed, int64_t m, const uint16_t* w, int64_t ldw,
                  int64_t k, int64_t n0, int64_t n1, float* y, int64_t ldy);

}  // namespace ember::skinny::kernels
