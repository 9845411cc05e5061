// The skinny matmul: out = epilogue(x·wᵀ + bias) for an x of a few rows, read against torch's [N, K] weight where
// it lies. Internal to ember_core; ember::Linear sends the calls it fits to it.
//
// With a few rows, a matmul is a stream over the weight: each weight element is used M times, so the time is the
// weight's bytes over the memory (or cache) bandwidth, and what matters is reading the weight once, at full speed,
// with no per-call set-up. oneDNN's matmul on an unpacked weight reorders slices of it on every call (0.4-0.6x of
// the packed speed at 1-8 rows, benchmarks/results/linear-*.md); this kernel runs straight down the rows of w,
// dot products along k, the m rows of x kept in registers (on AMX: w's rows as A tiles, x re-laid as a B tile by each
// thread), each thread its own slice of w's rows. Every output is one thread's sum in one fixed order, so results
// do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/epilogue.h"
#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::skinny {

/// The most rows of x the vector paths take (they are unrolled for 1..kMaxRows). Up to 8 rows they beat oneDNN
/// on an unpacked weight on the Xeon (benchmarks/results/linear-*.md); beyond, each weight element is used often
/// enough that register blocking over rows wins, and the vector paths' multiply-adds, not the weight's stream,
/// set their speed.
inline constexpr int64_t kMaxRows = 8;
/// The rows the AMX path takes (bf16 at Isa::amx, k >= 32): up to two B tiles of 16 rows of x, against 16 rows of
/// w per tile multiply, each A tile of w used for both, so it still runs at the weight's streaming speed there. A
/// single row stays on AVX512-BF16, which streams it as fast with no packing of x and no tile set-up
/// (benchmarks/results/linear-*.md).
inline constexpr int64_t kMaxAmxRows = 32;
inline constexpr int64_t kMinAmxRows = 2;

/// The most rows of x the kernel takes for `dtype` under the current ISA cap: kMaxAmxRows for bf16 where AMX
/// runs, kMaxRows otherwise.
int64_t max_rows(DType dtype) noexcept;

/// True when the kernel takes these operands: 1 <= x.size(0) <= max_rows(x.dtype()), x and w of one dtype (f32 or
/// bf16), w with unit stride along k.
bool takes(const TensorView& x, const TensorView& w) noexcept;

/// out = epilogue(x·wᵀ + bias). x [M, K], w [N, K], bias empty or N floats, out [M, N] (f32, or bf16 for bf16
/// inputs) and residual [M, N] (f32 or bf16) with unit stride along N. The caller (ember::Linear) has checked
/// the shapes, dtypes and overlaps; `takes(x, w)` holds.
void matmul(const TensorView& x, const TensorView& w, const std::vector<float>& bias, const TensorView& out,
            const Epilogue& epilogue, const TensorView* residual);

/// The level the kernel runs at for m rows of `dtype` (f32 or bf16) of length k under the current ISA cap.
Isa implementation(DType dtype, int64_t m, int64_t k);

}  // namespace ember::skinny
