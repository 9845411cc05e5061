// Per-ISA bodies of the epilogue (epilogue_rows.h). Internal to ember_core: epilogue_rows.cpp picks one.
#pragma once

#include <cstdint>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::epilogue::kernels {

/// One row: out[j] = ops(sums[j] + bias[j]) for j < n, with residual[j] as the add's operand. The pointers are at
/// the row's first column; bias and residual may be null (no bias, no add); sums, out and residual are f32 or bf16
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

void finish_row_ref(const Row& row);
void finish_row_avx2(const Row& row);
void finish_row_avx512(const Row& row);

}  // namespace ember::epilogue::kernels
