// The Linear router: which kernel serves a call. Every rule that picks between the caller's own matmul (torch's),
// ember's skinny matmul, ember's tile matmul, oneDNN's matmul computed transposed and oneDNN's plain matmul lives here,
// each with the measurement that set it (benchmarks/results/linear-*.md), so that a new kernel is one more rule in one
// place. Internal to ember_core: callers ask ember::Linear::route, and Linear::forward runs what route_call picks.
#pragma once

#include <cstdint>

#include "ember/epilogue.h"
#include "ember/linear.h"
#include "ember/tensor_view.h"

namespace ember::linear {

/// Whether the caller's own matmul is the faster one for `rows` rows of a `compute` input on `weight` ([N, K] as
/// the caller holds it; `in_place`: the layer reads it there rather than a packed copy). `caller_mkl_fp32`: the
/// caller's fp32 matmul is MKL's on an Intel CPU; the fp32 rules were measured only there.
bool caller_is_faster(DType compute, int64_t rows, const TensorView& weight, bool in_place, bool caller_mkl_fp32);

/// The ember kernel for a call whose arguments Linear::forward has checked: `weight` is the caller's weight when
/// the layer runs in place, else nullptr (a packed copy), and `packed_for_tiles` says whether that copy is in the
/// layout the tile matmul reads. Never LinearKernel::caller.
LinearKernel route_call(DType compute, const TensorView& x, const TensorView* weight, const TensorView& out,
                        const Epilogue& epilogue, const TensorView* residual, bool packed_for_tiles);

}  // namespace ember::linear
