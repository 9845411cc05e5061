// The skinny matmul: out = epilogue(x·wᵀ + bias) for an x of a few rows, read against torch's [N, K] weight where
// it lies. Internal to ember_core; ember::Linear sends the calls it fits to it.
//
// With a few rows, a matmul is a stream over the weight: each weight element is used M times, so the time is the
// weight's bytes over the memory (or cache) bandwidth, and what matters is reading the weight once, at full speed,
// with no per-call set-up. oneDNN's matmul on an unpacked weight reorders slices of it on every call (0.4-0.6x of
// the packed speed at 1-8 rows, benchmarks/results/linear-*.md); this kernel runs straight down the rows of w,
// dot products along k, the m rows of x kept in registers, each thread its own slice of w's rows. Every output is
// one thread's sum in one fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/epilogue.h"
#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::skinny {

/// The most rows of x the kernel takes (the kernels are unrolled for 1..kMaxRows). Up to 8 rows it beats oneDNN
/// on an unpacked weight on the Xeon (benchmarks/results/linear-*.md); beyond, each weight element is used often
/// enough that register and AMX-tile blocking over rows (oneDNN) wins.
inline constexpr int64_t kMaxRows = 8;

/// True when the kernel takes these operands: 1 <= x.size(0) <= kMaxRows, x and w of one dtype (f32 or bf16), w
/// with unit stride along k.
bool takes(const TensorView& x, const TensorView& w) noexcept;

/// out = epilogue(x·wᵀ + bias). x [M, K], w [N, K], bias empty or N floats, out [M, N] (f32, or bf16 for bf16
/// inputs) and residual [M, N] (f32 or bf16) with unit stride along N. The caller (ember::Linear) has checked
/// the shapes, dtypes and overlaps; `takes(x, w)` holds.
void matmul(const TensorView& x, const TensorView& w, const std::vector<float>& bias, const TensorView& out,
            const Epilogue& epilogue, const TensorView* residual);

/// The level the kernel runs at for `dtype` (f32 or bf16) under the current ISA cap.
Isa implementation(DType dtype);

}  // namespace ember::skinny
