// Per-ISA bodies of the epilogue (epilogue_rows.h). Internal to ember_core: epilogue_rows.cpp picks one.
#pragma once

#include <cstdint>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::epilogue::kernels {

/// One row: out[j] = ops(sums[j] + bias[j]) for j < n, with residual[j] as the add's operand. The pointers are at
/// the row's first column; bias and residual may be null (no bias, no add); sums, out and residual are f32, bf16 or f16
/// (out may be sums itself).
struct Row {
  const void* sums;
  DType sums_dtype;
  const float* bias;
  const PostOp* ops;
  int64_t num_ops;
  const void* residual;
  DType residual_dtype;
  void* out;
  DType out_dtype;
  int64_t n;
};

using FinishRowFn = void (*)(const Row& row);

// One per ISA (epilogue_kernels.cpp, compiled for each by ember_kernel_family).
#define EMBER_EPILOGUE_DECLARE_KERNELS(isa) void finish_row_##isa(const Row& row);
EMBER_EPILOGUE_DECLARE_KERNELS(ref)
EMBER_EPILOGUE_DECLARE_KERNELS(avx2)
EMBER_EPILOGUE_DECLARE_KERNELS(avx512)
EMBER_EPILOGUE_DECLARE_KERNELS(avx512_bf16)
#undef EMBER_EPILOGUE_DECLARE_KERNELS

}  // namespace ember::epilogue::kernels
