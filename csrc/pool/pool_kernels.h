// Per-ISA bodies of ember/pool.h over a range of output rows; pool.cpp checks the arguments and shares the rows out.
#pragma once

#include <cstdint>

namespace ember::pool::kernels {

enum class PoolKind : uint8_t { max, average };

// Strides in elements; channels have stride 1. bf16: uint16_t storage for x and out alike (else float).
struct PoolArgs {
  const void* x = nullptr;
  void* out = nullptr;
  bool bf16 = false;
  PoolKind kind = PoolKind::max;
  bool relu = false;              // max: max(out, 0) after
  bool count_include_pad = true;  // average: the padding counts in the divisor
  int64_t divisor = 0;            // average: a fixed divisor (torch's divisor_override), 0 for none
  int64_t channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  int64_t x_sn = 0, x_sh = 0, x_sw = 0, out_sn = 0, out_sh = 0, out_sw = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  // Work item r of [0, N·OH·channel_chunks) is output row (n, oh) = (r / chunks) / OH, % OH, channels
  // [c · chunk_channels, ...) with c = r % chunks: a global pool at batch 1 has one output row, so its channels
  // are what spreads over threads.
  int64_t channel_chunks = 1, chunk_channels = 0;
};

using PoolFn = void (*)(const PoolArgs& a, int64_t item_begin, int64_t item_end);
void pool2d_ref(const PoolArgs& a, int64_t item_begin, int64_t item_end);
void pool2d_avx2(const PoolArgs& a, int64_t item_begin, int64_t item_end);
void pool2d_avx512(const PoolArgs& a, int64_t item_begin, int64_t item_end);

}  // namespace ember::pool::kernels
