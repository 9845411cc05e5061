// Max pooling: the window's geometry checked as torch checks it, the operands as strides, and the parallel pass over
// the output rows. The arithmetic lives in max_pool_body.inl.
#include <string_view>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/pool.h"
#include "max_pool_kernels.h"

namespace ember::pool {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "max_pool2d";

constexpr IsaImpl<MaxPoolFn> kMaxPool[3] = {
    {Isa::avx512, max_pool2d_avx512}, {Isa::avx2, max_pool2d_avx2}, {Isa::ref, max_pool2d_ref}};

// Work worth a fork/join (window taps times channels: about 30 us of loads), and the least a chunk then holds.
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 12;

// Floor division, rounding toward -infinity (torch's div_rtn): the numerator of an output size may be negative.
int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

}  // namespace

Isa implementation() { return select_impl(kMaxPool, active_isa()).isa; }

int64_t output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode) {
  EMBER_CHECK(kernel >= 1 && stride >= 1 && dilation >= 1, ValueError, kOp,
              ": kernel_size, stride and dilation must be at least 1, got kernel_size ", kernel, ", stride ", stride,
              ", dilation ", dilation);
  EMBER_CHECK(padding >= 0 && padding <= kernel / 2, ValueError, kOp,
              ": padding must be between 0 and half the kernel size, got padding ", padding, " for kernel_size ",
              kernel);
  EMBER_CHECK(input >= 1, ValueError, kOp, ": each spatial size must be at least 1, got ", input);
  const int64_t span = dilation * (kernel - 1) + 1;
  int64_t out = floor_div(input + 2 * padding - span + (ceil_mode ? stride - 1 : 0), stride) + 1;
  // In ceil mode the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= input + padding) --out;
  EMBER_CHECK(out >= 1, ValueError, kOp, ": the window (kernel_size ", kernel, ", dilation ", dilation, ", padding ",
              padding, ") does not fit a spatial size of ", input);
  return out;
}

void max_pool2d(const TensorView& x, const Window2d& window, bool relu, const TensorView& out) {
  EMBER_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, TypeError, kOp,
              ": x must have dtype float32 or bfloat16, got ", dtype_name(x.dtype()));
  EMBER_CHECK(x.ndim() == 4, ValueError, kOp, ": x must be 4-D [batch, channels, height, width], got ", x.describe());
  EMBER_CHECK(x.size(1) >= 1, ValueError, kOp, ": x must have at least one channel, got ", x.describe());
  EMBER_CHECK(x.size(1) == 1 || x.stride(1) == 1, ValueError, kOp,
              ": x must have channels of stride 1 (channels-last), got ", x.describe());
  const int64_t out_h = output_size(x.size(2), window.kernel[0], window.stride[0], window.padding[0],
                                    window.dilation[0], window.ceil_mode);
  const int64_t out_w = output_size(x.size(3), window.kernel[1], window.stride[1], window.padding[1],
                                    window.dilation[1], window.ceil_mode);
  EMBER_CHECK(out.dtype() == x.dtype(), TypeError, kOp, ": out must have x's dtype ", dtype_name(x.dtype()), ", got ",
              dtype_name(out.dtype()));
  EMBER_CHECK(out.ndim() == 4 && out.size(0) == x.size(0) && out.size(1) == x.size(1) && out.size(2) == out_h &&
                  out.size(3) == out_w,
              ValueError, kOp, ": out must be [", x.size(0), ", ", x.size(1), ", ", out_h, ", ", out_w, "] for x ",
              x.describe(), ", got ", out.describe());
  EMBER_CHECK(out.is_dense() && (out.size(1) == 1 || out.stride(1) == 1), ValueError, kOp,
              ": out must hold each element once with channels of stride 1, got ", out.describe());
  check::no_overlap(kOp, "out", out, "x", x);
  if (out.numel() == 0) return;

  MaxPoolArgs a;
  a.x = x.data();
  a.out = out.data();
  a.bf16 = x.dtype() == DType::bf16;
  a.relu = relu;
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
  const int64_t rows = x.size(0) * out_h;
  const int64_t row_work = out_w * a.channels * window.kernel[0] * window.kernel[1];
  const MaxPoolFn fn = select_impl(kMaxPool, active_isa()).fn;
  const int64_t grain = row_grain(rows, row_work, kParallelElements, kChunkElements);
  parallel_for(rows, grain, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

}  // namespace ember::pool
