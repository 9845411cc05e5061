// Max and average pooling: the window's geometry checked as torch checks it, the operands as strides, and the
// parallel pass over the output rows (and, where there are few, over channel chunks). The arithmetic lives in
// pool_body.inl.
#include <algorithm>
#include <string>
#include <string_view>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/pool.h"
#include "ember/trace.h"
#include "pool_kernels.h"

namespace ember::pool {
namespace {

using namespace kernels;

constexpr IsaImpl<PoolFn> kPool[3] = {{Isa::avx512, pool2d_avx512}, {Isa::avx2, pool2d_avx2}, {Isa::ref, pool2d_ref}};

// Work worth a fork/join (window taps times channels: about 30 us of loads), and the least a chunk then holds.
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 12;
// Channels a work item holds at least when a pool has fewer output rows than threads: four AVX-512 vectors.
constexpr int64_t kChannelGrain = 64;

// Floor division, rounding toward -infinity (torch's div_rtn): the numerator of an output size may be negative.
int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

// torch's output size along one dimension (pooling_output_shape), checked as torch checks the geometry; messages
// name `op`.
int64_t checked_output_size(std::string_view op, int64_t input, int64_t kernel, int64_t stride, int64_t padding,
                            int64_t dilation, bool ceil_mode) {
  EMBER_CHECK(kernel >= 1 && stride >= 1 && dilation >= 1, ValueError, op,
              ": kernel_size, stride and dilation must be at least 1, got kernel_size ", kernel, ", stride ", stride,
              ", dilation ", dilation);
  EMBER_CHECK(padding >= 0 && padding <= kernel / 2, ValueError, op,
              ": padding must be between 0 and half the kernel size, got padding ", padding, " for kernel_size ",
              kernel);
  EMBER_CHECK(input >= 1, ValueError, op, ": each spatial size must be at least 1, got ", input);
  const int64_t span = dilation * (kernel - 1) + 1;
  int64_t out = floor_div(input + 2 * padding - span + (ceil_mode ? stride - 1 : 0), stride) + 1;
  // In ceil mode the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= input + padding) --out;
  EMBER_CHECK(out >= 1, ValueError, op, ": the window (kernel_size ", kernel, ", dilation ", dilation, ", padding ",
              padding, ") does not fit a spatial size of ", input);
  return out;
}

// The checks both pools make, and the arguments they share; `op` names the caller in messages.
PoolArgs checked_args(std::string_view op, const TensorView& x, const Window2d& window, const TensorView& out) {
  EMBER_CHECK(is_f32_or_bf16(x.dtype()), TypeError, op, ": x must have dtype float32 or bfloat16, got ",
              dtype_name(x.dtype()));
  EMBER_CHECK(x.ndim() == 4, ValueError, op, ": x must be 4-D [batch, channels, height, width], got ", x.describe());
  EMBER_CHECK(x.size(1) >= 1, ValueError, op, ": x must have at least one channel, got ", x.describe());
  EMBER_CHECK(x.size(1) == 1 || x.stride(1) == 1, ValueError, op,
              ": x must have channels of stride 1 (channels-last), got ", x.describe());
  const int64_t out_h = checked_output_size(op, x.size(2), window.kernel[0], window.stride[0], window.padding[0],
                                            window.dilation[0], window.ceil_mode);
  const int64_t out_w = checked_output_size(op, x.size(3), window.kernel[1], window.stride[1], window.padding[1],
                                            window.dilation[1], window.ceil_mode);
  EMBER_CHECK(out.dtype() == x.dtype(), TypeError, op, ": out must have x's dtype ", dtype_name(x.dtype()), ", got ",
              dtype_name(out.dtype()));
  EMBER_CHECK(out.ndim() == 4 && out.size(0) == x.size(0) && out.size(1) == x.size(1) && out.size(2) == out_h &&
                  out.size(3) == out_w,
              ValueError, op, ": out must be [", x.size(0), ", ", x.size(1), ", ", out_h, ", ", out_w, "] for x ",
              x.describe(), ", got ", out.describe());
  EMBER_CHECK(out.is_dense() && (out.size(1) == 1 || out.stride(1) == 1), ValueError, op,
              ": out must hold each element once with channels of stride 1, got ", out.describe());
  check::no_overlap(op, "out", out, "x", x);

  PoolArgs a;
  a.x = x.data();
  a.out = out.data();
  a.bf16 = x.dtype() == DType::bf16;
  a.channels = x.size(1);
  a.height = x.size(2);
  a.width = x.size(3);
  a.out_height = out_h;
  a.out_width = out_w;
  a.x_sn = x.stride(0);
  a.x_sh = x.stride(2);
  a.x_sw = x.stride(3);
  a.out_sn = out.stride(0);
  a.out_sh = out.stride(2);
  a.out_sw = out.stride(3);
  a.kernel_h = window.kernel[0];
  a.kernel_w = window.kernel[1];
  a.stride_h = window.stride[0];
  a.stride_w = window.stride[1];
  a.pad_h = window.padding[0];
  a.pad_w = window.padding[1];
  a.dilation_h = window.dilation[0];
  a.dilation_w = window.dilation[1];
  return a;
}

void run(PoolArgs& a, int64_t batch) {
  const int64_t rows = batch * a.out_height;
  if (rows == 0) return;
  // Fewer output rows than threads (a global pool at a small batch): channel chunks of kChannelGrain or more too.
  const int64_t threads = num_threads();
  a.channel_chunks = 1;
  a.chunk_channels = a.channels;
  if (rows < threads && a.channels > kChannelGrain) {
    const int64_t wanted = std::min((threads + rows - 1) / rows, (a.channels + kChannelGrain - 1) / kChannelGrain);
    a.chunk_channels = (a.channels + wanted - 1) / wanted;
    a.chunk_channels = (a.chunk_channels + kChannelGrain - 1) / kChannelGrain * kChannelGrain;
    a.channel_chunks = (a.channels + a.chunk_channels - 1) / a.chunk_channels;
  }
  const int64_t items = rows * a.channel_chunks;
  const int64_t item_work = a.out_width * a.chunk_channels * a.kernel_h * a.kernel_w;
  const auto& impl = select_impl(kPool, active_isa());
  const KernelTrace trace(a.kind == PoolKind::max ? "max_pool2d" : "avg_pool2d", impl.isa, [&] {
    return "n=" + std::to_string(batch) + ",c=" + std::to_string(a.channels) + ",out=" + std::to_string(a.out_height) +
           "x" + std::to_string(a.out_width) + ",window=" + std::to_string(a.kernel_h) + "x" +
           std::to_string(a.kernel_w);
  });
  const PoolFn fn = impl.fn;
  const int64_t grain = row_grain(items, item_work, kParallelElements, kChunkElements);
  parallel_for(items, grain, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

}  // namespace

Isa implementation() { return select_impl(kPool, active_isa()).isa; }

int64_t output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode) {
  return checked_output_size("pool2d", input, kernel, stride, padding, dilation, ceil_mode);
}

void max_pool2d(const TensorView& x, const Window2d& window, bool relu, const TensorView& out) {
  PoolArgs a = checked_args("max_pool2d", x, window, out);
  a.kind = PoolKind::max;
  a.relu = relu;
  run(a, x.size(0));
}

void avg_pool2d(const TensorView& x, const Window2d& window, bool count_include_pad, int64_t divisor_override,
                const TensorView& out) {
  constexpr std::string_view op = "avg_pool2d";
  EMBER_CHECK(window.dilation[0] == 1 && window.dilation[1] == 1, ValueError, op,
              ": the window's dilation must be 1, got ", window.dilation[0], ", ", window.dilation[1]);
  EMBER_CHECK(divisor_override >= 0, ValueError, op, ": divisor_override must be positive (0 for none), got ",
              divisor_override);
  PoolArgs a = checked_args(op, x, window, out);
  a.kind = PoolKind::average;
  a.count_include_pad = count_include_pad;
  a.divisor = divisor_override;
  run(a, x.size(0));
}

}  // namespace ember::pool
