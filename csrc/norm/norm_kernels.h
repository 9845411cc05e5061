// Per-ISA bodies of ember/norm.h:
// - the per-channel affine map y = x * scale[c] + shift[c], over a range of rows of a tensor seen as
//   [outer, C, inner]: with inner > 1 (row-major x) a row is one channel's inner elements; with inner == 1
//   (channels-last x) a row is one position's C channels. X and Y are float or uint16_t (bfloat16 bits), or both
//   double;
// - the row normalisations (LayerNorm, RMSNorm) with a residual add, over a range of rows of [rows, cols] operands
//   of float32 or bfloat16 each.
#pragma once

#include <cstdint>
#include "ember/tensor_view.h"

namespace ember::norm::kernels {

template <typename X, typename Y>
struct AffineArgs {
  const X* x = nullptr;
  Y* y = nullptr;
  const Arithmetic<X>* scale = nullptr;  // [C]
  const Arithmetic<X>* shift = nullptr;  // [C], or null for none (the backward)
  int64_t channels = 0;
  int64_t inner = 0;
  bool relu = false;  // max(y, 0) after, NaN kept (float arithmetic only)
};

template <typename X, typename Y>
using AffineFn = void (*)(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end);

#define EMBER_NORM_DECLARE(isa)                                                           \
  template <typename X, typename Y>                                                       \
  void channel_rows_##isa(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end); \
  template <typename X, typename Y>                                                       \
  void position_rows_##isa(const AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end);
EMBER_NORM_DECLARE(ref)
EMBER_NORM_DECLARE(avx2)
EMBER_NORM_DECLARE(avx512)
#undef EMBER_NORM_DECLARE

// float64: the reference body in double (norm_kernels.cpp, ref compilation), on every machine.
void channel_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end);
void position_rows_f64(const AffineArgs<double, double>& a, int64_t row_begin, int64_t row_end);

// One [rows, cols] operand of a row normalisation: rows `stride` elements apart (0: one row read for all), the last
// dimension dense; P is `const void` for an input, `void` for an output. data null: absent.
template <typename P>
struct Rows {
  P* data = nullptr;
  int64_t stride = 0;
  bool bf16 = false;
};

struct RowNormArgs {
  bool rms = false;  // RMSNorm's statistics (else LayerNorm's)
  float eps = 0.0f;
  int64_t cols = 0;
  Rows<const void> x, residual;
  Rows<void> sum;                // h = x + residual where the caller keeps it; h's storage type (bf16 iff both are)
  const void* weight = nullptr;  // [cols], or null
  const void* bias = nullptr;    // [cols], or null
  bool params_bf16 = false;      // weight and bias are bfloat16 (else float32)
  Rows<void> out;
  Rows<void> out_bf16;  // out (float32) rounded to bfloat16 too, or absent
};

using RowNormFn = void (*)(const RowNormArgs& a, int64_t row_begin, int64_t row_end);
void row_norm_ref(const RowNormArgs& a, int64_t row_begin, int64_t row_end);
void row_norm_avx2(const RowNormArgs& a, int64_t row_begin, int64_t row_end);
void row_norm_avx512(const RowNormArgs& a, int64_t row_begin, int64_t row_end);

}  // namespace ember::norm::kernels
