// The post-ops of ember's own matmul kernels, in vector lanes: bias, activations and a residual add or multiply applied
// to a block of fp32 sums as it is stored (f32, bf16 or f16). Internal to ember_core; oneDNN's primitives do the same
// for the layers that run on them (csrc/onednn/). The skinny matmul (csrc/skinny/) finishes each slice of its output
// here: a scalar loop over its M·N outputs had cost more than the multiply-adds before it on cache-resident
// weights (2-5x on the VM with an erf GELU).
#pragma once

#include <cstdint>

#include "ember/epilogue.h"
#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::epilogue {

/// out[i, j] = epilogue(sums[i·ld + j - n0] + bias[j]) for i < m and n0 <= j < n1. bias: null or at least n1
/// floats. residual (needed when the epilogue has an add or multiply) and out: [m, N] views, f32, bf16 or f16, with
/// unit stride along N; the caller has checked their shapes and dtypes. A column's value does not depend on n0 and n1
/// when n0 is a multiple of 16 (the lanes of the widest path), so a split of the columns into such chunks gives the
/// same result for any thread count.
void finish_rows(const float* sums, int64_t ld, int64_t m, int64_t n0, int64_t n1, const float* bias,
                 const Epilogue& epilogue, const TensorView* residual, const TensorView& out);

/// out = epilogue(source), for an f32, bf16 or f16 `out` of any shape and strides, a `source` of its shape that is
/// either `out` itself (in place) or a view of its own (f32, bf16 or f16; one laid out as `out` is read in runs, any
/// other layout element by element), and a `residual` (needed when the epilogue has an add or multiply;
/// f32, bf16 or f16) of its shape and any strides; the caller has checked them and that residual overlaps neither.
/// oneDNN's layers run their activations here (onednn::EpilogueSplit). Each element's value does not depend on the
/// thread count. In place on a bf16 `out`, the epilogue starts from the stored (rounded) values.
void finish_from(const Epilogue& epilogue, const TensorView& source, const TensorView* residual, const TensorView& out);

/// The level finish_rows and finish_from run at under the current ISA cap.
Isa implementation();

}  // namespace ember::epilogue
