// Per-ISA bodies of roi_align (ember/vision.h). roi_align.cpp computes each box's sample taps (an image position and
// a bilinear weight, four a sample, zero weight for a sample outside the image) in torchvision's arithmetic; these
// bodies do the per-channel work over an image stored channels-last (each position's C values contiguous), so a
// vector takes several channels of one tap at once. W is float, uint16_t (bfloat16 bits) or double.
#pragma once

#include <cstdint>
#include "ember/tensor_view.h"

namespace ember::vision::kernels {

/// One box's bins: bin b averages taps [b * taps_per_bin, (b + 1) * taps_per_bin) over `count` samples. R is the
/// arithmetic type.
template <typename R>
struct RoiTaps {
  const int64_t* position = nullptr;  // y * W + x within the box's image
  const R* weight = nullptr;
  int64_t bins = 0;
  int64_t taps_per_bin = 0;
  R count = 1;
};

/// Forward: out[bin * out_bin_stride + c * out_channel_stride] = the bin's average, for channels [0, channels).
template <typename W>
struct PoolArgs {
  const W* image = nullptr;  // [H * W, channels]
  int64_t channels = 0;
  W* out = nullptr;
  int64_t out_bin_stride = 0, out_channel_stride = 0;
};

/// Backward: grad[position, c] += weight * grad_out[bin, c] / count for channels [c_begin, c_end); grad_out read at
/// grad_bin_stride and grad_channel_stride.
template <typename W>
struct ScatterArgs {
  Arithmetic<W>* grad = nullptr;  // [H * W, channels], the arithmetic type
  int64_t channels = 0;
  const W* grad_out = nullptr;
  int64_t grad_bin_stride = 0, grad_channel_stride = 0;
};

template <typename W>
using PoolFn = void (*)(const RoiTaps<Arithmetic<W>>& taps, const PoolArgs<W>& a);
template <typename W>
using ScatterFn = void (*)(const RoiTaps<Arithmetic<W>>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end);

#define EMBER_ROI_ALIGN_DECLARE(isa)                                     \
  template <typename W>                                                  \
  void roi_pool_##isa(const RoiTaps<float>& taps, const PoolArgs<W>& a); \
  template <typename W>                                                  \
  void roi_scatter_##isa(const RoiTaps<float>& taps, const ScatterArgs<W>& a, int64_t c_begin, int64_t c_end);
EMBER_ROI_ALIGN_DECLARE(ref)
EMBER_ROI_ALIGN_DECLARE(avx2)
EMBER_ROI_ALIGN_DECLARE(avx512)
#undef EMBER_ROI_ALIGN_DECLARE

// float64: the reference body in double (roi_align_kernels.cpp, ref compilation), on every machine.
void roi_pool_f64(const RoiTaps<double>& taps, const PoolArgs<double>& a);
void roi_scatter_f64(const RoiTaps<double>& taps, const ScatterArgs<double>& a, int64_t c_begin, int64_t c_end);

}  // namespace ember::vision::kernels
