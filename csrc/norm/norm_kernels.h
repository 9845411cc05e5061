// Per-ISA bodies of the per-channel affine map y = x * scale[c] + shift[c] (ember/norm.h), over a range of rows of
// a tensor seen as [outer, C, inner]: with inner > 1 (row-major x) a row is one channel's inner elements; with
// inner == 1 (channels-last x) a row is one position's C channels. X and Y are float or uint16_t (bfloat16 bits), or
// both double.
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

}  // namespace ember::norm::kernels
