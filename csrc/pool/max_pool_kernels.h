// Per-ISA bodies of ember/pool.h over a range of output rows; max_pool.cpp checks the arguments and shares the rows
// out.
#pragma once

#include <cstdint>

namespace ember::pool::kernels {

// Strides in elements; channels have stride 1. bf16: uint16_t storage for x and out alike (else float).
struct MaxPoolArgs {
  const void* x = nullptr;
  void* out = nullptr;
  bool bf16 = false;
  bool relu = false;
  int64_t channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  int64_t x_sn = 0, x_sh = 0, x_sw = 0, out_sn = 0, out_sh = 0, out_sw = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};

// Output rows [row_begin, row_end) of the N·OH rows, row r being (n, oh) = (r / OH, r % OH).
using MaxPoolFn = void (*)(const MaxPoolArgs& a, int64_t row_begin, int64_t row_end);
void max_pool2d_ref(const MaxPoolArgs& a, int64_t row_begin, int64_t row_end);
void max_pool2d_avx2(const MaxPoolArgs& a, int64_t row_begin, int64_t row_end);
void max_pool2d_avx512(const MaxPoolArgs& a, int64_t row_begin, int64_t row_end);

}  // namespace ember::pool::kernels
