// The tile matmul: out = epilogue(x·wᵀ + bias) in bf16 on AMX tiles, for a hundred to a few hundred rows of x (a
// batch-1 sequence), reading the packed copy of w that oneDNN made for the layer (no second copy). It exists for what
// a forward's order does to a GEMM of 128 rows: each layer's weights arrive from the last-level cache, not L2, and
// oneDNN's matmul ran BERT's 48 GEMMs 1.45x slower in a forward's order than each one hot
// (benchmarks/results/tile_matmul-*.md). This kernel splits the output into (32-column panel, 32-row pair) units over
// the threads and prefetches each thread's next panel while it multiplies this one. Internal to ember_core: the
// Linear router (csrc/linear/) sends it calls.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::tile_matmul {

/// The packed layout this kernel reads, oneDNN's "BA16a<block_cols>b2a" for the matmul's B = wᵀ [K, N]: N in blocks
/// of `block_cols` columns (16, 32, 48 or 64: oneDNN picks by N), each block K/32 (rounded up) steps of 16 rows of k
/// pairs by `block_cols` columns, the two k of a pair adjacent (an AMX B tile is 16 columns of such a step); N and K
/// zero-padded to whole blocks and steps.
struct PackedLayout {
  int64_t n = 0, k = 0, block_cols = 0;
  int64_t steps() const noexcept { return (k + 31) / 32; }
};

/// The layout of a packed weight of logical shape B [k, n] (oneDNN's inner blocks, outermost first, with the
/// dimension each blocks, and the outer strides of the two dimensions, in elements), when it is one this kernel reads.
std::optional<PackedLayout> layout_from_blocking(int64_t k, int64_t n, const std::vector<int64_t>& inner_blocks,
                                                 const std::vector<int64_t>& inner_dims, int64_t k_stride,
                                                 int64_t n_stride);

/// Zeroes the weights of k >= layout.k in the last step of every block, which the kernel multiplies by zeros: a
/// padding that held a NaN or an infinity would otherwise reach the sums (0 * inf). oneDNN's reorders zero it too;
/// the kernel does not depend on that.
void zero_k_padding(uint16_t* packed, const PackedLayout& layout);

/// The row counts the router sends here. Against oneDNN's matmul on the same packed weight, BERT-base's 48 GEMMs in
/// a forward's order on the 16-core Xeon (bench_tile_matmul.py) ran 1.02-1.06x at 128, 192 and 256 rows and
/// 0.95-0.97x at 64, 384 and 512; the bounds sit halfway between.
inline constexpr int64_t kMinRows = 96;
inline constexpr int64_t kMaxRows = 320;

/// The most rows a call may have (Linear::forward_on checks it): each thread keeps the fp32 sums of its panels for
/// every row, M by up to a few panels of 32 columns.
inline constexpr int64_t kMaxCallRows = 4096;

/// Whether the kernel runs here (AMX under the current ISA cap) for `compute`: bf16 only.
bool available(DType compute) noexcept;

/// out = epilogue(x·wᵀ + bias [+ residual]) for x [M, K] bf16 with unit stride along K (rows at any stride >= K),
/// 1 <= M <= kMaxCallRows, and `packed` the weight in `layout`; out and residual [M, N] as Linear::forward checks them.
/// Requires available(DType::bf16). Each output's sum runs over k in one fixed order: the result does not depend on the
/// thread count.
void matmul(const TensorView& x, const uint16_t* packed, const PackedLayout& layout, const std::vector<float>& bias,
            const TensorView& out, const Epilogue& epilogue, const TensorView* residual);

/// The few-row matmul on the same packed copy (few_rows_avx512_bf16.cpp): a decoded token, or an encoder-decoder's
/// decoder at batch 1, where a matmul is a stream over the weight and oneDNN's per-call set-up outweighed it (4 x 384
/// x 384 bf16: ~25 us on the 16-core Xeon). Rows 1 to kMaxFewRows, vdpbf16ps against each packed pair row as it
/// lies, the columns split over the threads in groups of 16. Against oneDNN on the same copy on the 2-core Zen 5
/// (benchmarks/results/linear-few-rows-*): 1.05-1.39x at 1-4 rows on every shape measured (384 x 384 to 11008 x
/// 4096); at 5-8 rows 0.45-1.09x on 4096-wide layers, whether all rows were kept in registers (two column groups at a
/// time) or four at a time over each run of groups twice, so those stay oneDNN's.
inline constexpr int64_t kMaxFewRows = 4;

/// Whether the few-row matmul runs here for `compute`: bf16 under an ISA cap of AVX512-BF16 or more.
bool few_rows_available(DType compute) noexcept;

/// out = epilogue(x·wᵀ + bias [+ residual]) as matmul() computes it, for 1 <= M <= kMaxFewRows. Requires
/// few_rows_available(DType::bf16). Each output is one thread's sum over k in one fixed order: the result does not
/// depend on the thread count.
void few_rows_matmul(const TensorView& x, const uint16_t* packed, const PackedLayout& layout,
                     const std::vector<float>& bias, const TensorView& out, const Epilogue& epilogue,
                     const TensorView* residual);

}  // namespace ember::tile_matmul
