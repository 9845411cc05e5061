// Max and average pooling over the two spatial dimensions of a channels-last activation, torch's max_pool2d and
// avg_pool2d. Max: each output is the largest input of its window, NaN if the window holds one (torch's CPU kernels
// propagate NaN), the padding counting as -inf. With `relu`, max(that, 0) is written instead (NaN kept):
// relu(max_pool(x)) is max_pool(relu(x)) for every input, since ReLU is non-decreasing and keeps NaN, so graph mode
// moves a convolution's ReLU here, onto the pooled output, a quarter of the elements for a 3x3/2 pool, and saves the
// pass over the convolution's.
//
// Average: the window's sum in float32, row by row and tap by tap, divided once by torch's divisor (the window
// clipped to the padded input; to the input without count_include_pad; or a fixed divisor), the order torch's
// channels-last kernel adds in, so the results are its to the bit.
//
// The kernels read each channel vector of the window where it lies (channels have stride 1): a ResNet stem's pool,
// [16, 64, 112, 112] bf16 channels-last, is a read of its input at memory speed. A global pool (one window a
// channel) spreads its channels over the threads. Results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::pool {

/// A 2-D window's geometry, (height, width) pairs as torch's max_pool2d takes them.
struct Window2d {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
};

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// torch's output size along one spatial dimension of `input` elements (pooling_output_shape): the windows that
/// start inside the input or its left padding. ValueError where torch refuses the geometry (a kernel, stride or
/// dilation below 1, negative padding or padding past half the kernel, no whole window).
int64_t output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode);

/// out = max_pool2d(x, window), then max(out, 0) with `relu`.
///   x: [N, C, H, W], float32 or bfloat16, channels of stride 1 (channels-last), any other strides; C, H, W >= 1;
///   out: [N, C, OH, OW] (output_size of H and W), x's dtype, channels of stride 1, holding each element once,
///        sharing no memory with x.
/// Checked before anything is written.
void max_pool2d(const TensorView& x, const Window2d& window, bool relu, const TensorView& out);

/// out = avg_pool2d(x, window, count_include_pad, divisor_override): x and out as for max_pool2d; the window's
/// dilation must be 1 (torch's avg_pool2d has none); divisor_override 0 for none, else a positive divisor.
void avg_pool2d(const TensorView& x, const Window2d& window, bool count_include_pad, int64_t divisor_override,
                const TensorView& out);

}  // namespace ember::pool
