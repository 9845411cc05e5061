// The tile matmul's and the few-row matmul's splits over threads and their epilogue; the tile code is
// tile_matmul_amx.cpp, the few-row code few_rows_avx512_bf16.cpp.
#include "tile_matmul/tile_matmul.h"

#include <algorithm>
#include <string>

#include "ember/isa.h"
#include "ember/parallel.h"
#include "ember/trace.h"
#include "epilogue/epilogue_rows.h"
#include "tile_matmul/tile_matmul_kernels.h"

namespace ember::tile_matmul {
namespace {

using kernels::kPairRows;
using kernels::kPanelCols;

// Rows [row0, row0 + rows) of a 2-D view.
TensorView rows_of(const TensorView& v, int64_t row0, int64_t rows) {
  auto* data = static_cast<char*>(v.data()) + row0 * v.stride(0) * static_cast<int64_t>(dtype_size(v.dtype()));
  const int64_t sizes[2] = {rows, v.size(1)}, strides[2] = {v.stride(0), v.stride(1)};
  return TensorView(data, v.dtype(), sizes, strides, 2);
}

}  // namespace

std::optional<PackedLayout> layout_from_blocking(int64_t k, int64_t n, const std::vector<int64_t>& inner_blocks,
                                                 const std::vector<int64_t>& inner_dims, int64_t k_stride,
                                                 int64_t n_stride) {
  // "16a<c>b2a": k pairs in 16 rows of c columns, the k of a pair innermost; whole blocks of N outermost.
  if (inner_blocks.size() != 3 || inner_dims != std::vector<int64_t>{0, 1, 0}) return std::nullopt;
  const int64_t cols = inner_blocks[1];
  if (inner_blocks[0] != 16 || inner_blocks[2] != 2 || cols < 16 || cols > 64 || cols % 16 != 0) return std::nullopt;
  const PackedLayout layout{n, k, cols};
  if (k_stride != 32 * cols || n_stride != layout.steps() * 32 * cols) return std::nullopt;
  return layout;
}

void zero_k_padding(uint16_t* packed, const PackedLayout& layout) {
  const int64_t tail = layout.k % 32, cols = layout.block_cols, steps = layout.steps();
  if (tail == 0) return;
  const int64_t blocks = (layout.n + cols - 1) / cols;
  for (int64_t b = 0; b < blocks; ++b) {
    uint16_t* last_step = packed + (b * steps + steps - 1) * 32 * cols;
    for (int64_t kk = tail; kk < 32; ++kk) {
      for (int64_t c = 0; c < cols; ++c) last_step[(kk / 2 * cols + c) * 2 + kk % 2] = 0;
    }
  }
}

bool available(DType compute) noexcept { return compute == DType::bf16 && active_isa() >= Isa::amx; }

void matmul(const TensorView& x, const uint16_t* packed, const PackedLayout& layout, const std::vector<float>& bias,
            const TensorView& out, const Epilogue& epilogue, const TensorView* residual) {
  const int64_t m = x.size(0);
  const KernelTrace trace("tile_matmul", Isa::amx, [&] {
    return "m=" + std::to_string(m) + ",n=" + std::to_string(layout.n) + ",k=" + std::to_string(layout.k) + ",bf16";
  });
  const int64_t pairs = (m + kPairRows - 1) / kPairRows, panels = (layout.n + kPanelCols - 1) / kPanelCols;
  const auto* xs = x.data_as<const uint16_t>();
  const float* bias_data = bias.empty() ? nullptr : bias.data();
  // Contiguous ranges of units, panel by panel: a thread's units of one panel read its weights once from beyond
  // its caches, and a panel is split between at most two threads.
  parallel_for(panels * pairs, 1, 1, [&](int64_t, int64_t u0, int64_t u1) {
    const int64_t first = u0 / pairs, last = (u1 - 1) / pairs, col0 = first * kPanelCols;
    const int64_t ld = (last - first + 1) * kPanelCols;
    thread_local std::vector<float> sums;
    sums.resize(static_cast<size_t>(m * ld));
    kernels::run_units_amx(xs, x.stride(0), m, packed, layout, u0, u1, sums.data(), ld, col0);
    // The epilogue once over each row pair's run of panels, rows as wide as the range allows: a call per unit's row
    // of 32 columns cost more than the tile multiplies of BERT's smaller GEMMs.
    for (int64_t q = 0; q < pairs; ++q) {
      const int64_t lo = first + (first * pairs + q < u0 ? 1 : 0), hi = last - (last * pairs + q >= u1 ? 1 : 0);
      if (lo > hi) continue;
      const int64_t row0 = q * kPairRows, rows = std::min(kPairRows, m - row0);
      const int64_t n0 = lo * kPanelCols, n1 = std::min((hi + 1) * kPanelCols, layout.n);
      const TensorView out_rows = rows_of(out, row0, rows);
      const TensorView residual_rows = residual != nullptr ? rows_of(*residual, row0, rows) : TensorView();
      epilogue::finish_rows(sums.data() + row0 * ld + (n0 - col0), ld, rows, n0, n1, bias_data, epilogue,
                            residual != nullptr ? &residual_rows : nullptr, out_rows);
    }
  });
}

bool few_rows_available(DType compute) noexcept { return compute == DType::bf16 && active_isa() >= Isa::avx512_bf16; }

void few_rows_matmul(const TensorView& x, const uint16_t* packed, const PackedLayout& layout,
                     const std::vector<float>& bias, const TensorView& out, const Epilogue& epilogue,
                     const TensorView* residual) {
  // (Traced by Linear, its one caller, as "linear few_rows".)
  const int64_t m = x.size(0);
  constexpr int64_t kGroup = kernels::kFewRowGroupCols;
  const int64_t groups = (layout.n + kGroup - 1) / kGroup;
  // Each chunk at least ~16 KB of the weight: below that a thread's share is shorter than its start.
  const int64_t grain = std::max<int64_t>(1, (512 + layout.k - 1) / layout.k);
  const auto* xs = x.data_as<const uint16_t>();
  const float* bias_data = bias.empty() ? nullptr : bias.data();
  parallel_for(groups, grain, 1, [&](int64_t, int64_t g0, int64_t g1) {
    const int64_t ld = (g1 - g0) * kGroup, n0 = g0 * kGroup, n1 = std::min(g1 * kGroup, layout.n);
    thread_local std::vector<float> sums;
    sums.resize(static_cast<size_t>(m * ld));
    kernels::few_rows_avx512_bf16(xs, x.stride(0), m, packed, layout, g0, g1, sums.data(), ld, n0);
    epilogue::finish_rows(sums.data(), ld, m, n0, n1, bias_data, epilogue, residual, out);
  });
}

}  // namespace ember::tile_matmul
