// roi_align: argument checks, each box's sample taps in torchvision's arithmetic, the channels-last staging of a
// row-major image, and the parallel split (boxes in the forward, channel blocks in the backward). The per-channel
// arithmetic lives in roi_align_body.inl.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/bf16.h"

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/vision.h"
#include "roi_align_kernels.h"

namespace ember::vision {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "roi_align";

template <typename W>
constexpr IsaImpl<PoolFn<W>> kPool[3] = {
    {Isa::avx512, roi_pool_avx512<W>}, {Isa::avx2, roi_pool_avx2<W>}, {Isa::ref, roi_pool_ref<W>}};
template <typename W>
constexpr IsaImpl<ScatterFn<W>> kScatter[3] = {
    {Isa::avx512, roi_scatter_avx512<W>}, {Isa::avx2, roi_scatter_avx2<W>}, {Isa::ref, roi_scatter_ref<W>}};

// Channels a backward task owns: enough for whole vectors, small enough that 256 channels feed 16 threads.
constexpr int64_t kChannelBlock = 16;

struct Image {
  int64_t n = 0, c = 0, h = 0, w = 0;
  bool channels_last = false;
};

Image check_image(std::string_view name, const TensorView& t) {
  EMBER_CHECK(t.ndim() == 4, ValueError, kOp, ": ", name, " must be 4-D [N, C, H, W], got ", t.describe());
  EMBER_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, TypeError, kOp, ": ", name,
              " must have dtype float32 or bfloat16, got ", dtype_name(t.dtype()));
  Image im{t.size(0), t.size(1), t.size(2), t.size(3), false};
  if (t.is_contiguous()) return im;
  const bool nhwc = t.is_dense() && t.stride(1) == 1 && t.stride(3) == im.c && t.stride(2) == im.w * im.c;
  EMBER_CHECK(nhwc, ValueError, kOp, ": ", name, " must be contiguous or channels-last, got a ", t.describe(),
              " view with other strides");
  im.channels_last = true;
  return im;
}

// One box's taps, in torchvision's CPU arithmetic (roi_align_kernel.cpp: the box in float from double products,
// pre_calc_for_bilinear_interpolate for the samples).
struct BoxTaps {
  int64_t batch = 0;
  std::vector<int64_t> position;
  std::vector<float> weight;
  int64_t taps_per_bin = 0;
  float count = 1.0f;
};

void box_taps(const float* roi, const RoiAlignOptions& o, const Image& im, BoxTaps& out) {
  out.batch = static_cast<int64_t>(roi[0]);
  const float offset = o.aligned ? 0.5f : 0.0f;
  const auto start_w = static_cast<float>(roi[1] * o.spatial_scale - offset);
  const auto start_h = static_cast<float>(roi[2] * o.spatial_scale - offset);
  const auto end_w = static_cast<float>(roi[3] * o.spatial_scale - offset);
  const auto end_h = static_cast<float>(roi[4] * o.spatial_scale - offset);
  float roi_w = end_w - start_w, roi_h = end_h - start_h;
  if (!o.aligned) {
    roi_w = std::max(roi_w, 1.0f);
    roi_h = std::max(roi_h, 1.0f);
  }
  const float bin_h = roi_h / static_cast<float>(o.pooled_height), bin_w = roi_w / static_cast<float>(o.pooled_width);
  const auto grid_h =
      static_cast<int64_t>(o.sampling_ratio > 0 ? o.sampling_ratio : std::ceil(roi_h / o.pooled_height));
  const auto grid_w = static_cast<int64_t>(o.sampling_ratio > 0 ? o.sampling_ratio : std::ceil(roi_w / o.pooled_width));
  out.count = static_cast<float>(std::max<int64_t>(grid_h * grid_w, 1));
  out.taps_per_bin = 4 * std::max<int64_t>(grid_h, 0) * std::max<int64_t>(grid_w, 0);
  const int64_t bins = o.pooled_height * o.pooled_width;
  out.position.assign(static_cast<size_t>(bins * out.taps_per_bin), 0);
  out.weight.assign(static_cast<size_t>(bins * out.taps_per_bin), 0.0f);
  const auto height = static_cast<float>(im.h), width = static_cast<float>(im.w);
  int64_t k = 0;
  for (int64_t ph = 0; ph < o.pooled_height; ++ph) {
    for (int64_t pw = 0; pw < o.pooled_width; ++pw) {
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const float yy = start_h + static_cast<float>(ph) * bin_h +
                         static_cast<float>(iy + .5f) * bin_h / static_cast<float>(grid_h);
        for (int64_t ix = 0; ix < grid_w; ++ix, k += 4) {
          const float xx = start_w + static_cast<float>(pw) * bin_w +
                           static_cast<float>(ix + .5f) * bin_w / static_cast<float>(grid_w);
          float y = yy, x = xx;
          if (y < -1.0f || y > height || x < -1.0f || x > width) continue;  // zero weights
          if (y <= 0) y = 0;
          if (x <= 0) x = 0;
          auto y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x);
          int64_t y_high, x_high;
          if (y_low >= im.h - 1) {
            y_high = y_low = im.h - 1;
            y = static_cast<float>(y_low);
          } else {
            y_high = y_low + 1;
          }
          if (x_low >= im.w - 1) {
            x_high = x_low = im.w - 1;
            x = static_cast<float>(x_low);
          } else {
            x_high = x_low + 1;
          }
          const float ly = y - static_cast<float>(y_low), lx = x - static_cast<float>(x_low);
          const float hy = 1.0f - ly, hx = 1.0f - lx;
          const int64_t base = k;  // taps run bin by bin, sample by sample, four a sample
          const int64_t pos[4] = {y_low * im.w + x_low, y_low * im.w + x_high, y_high * im.w + x_low,
                                  y_high * im.w + x_high};
          const float wt[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
          for (int t = 0; t < 4; ++t) {
            out.position[base + t] = pos[t];
            out.weight[base + t] = wt[t];
          }
        }
      }
    }
  }
}

void check_options(const RoiAlignOptions& o) {
  EMBER_CHECK(o.pooled_height > 0 && o.pooled_width > 0, ValueError, kOp, ": output_size must be positive, got (",
              o.pooled_height, ", ", o.pooled_width, ")");
  EMBER_CHECK(std::isfinite(o.spatial_scale), ValueError, kOp, ": spatial_scale must be finite, got ", o.spatial_scale);
}

void check_rois(const TensorView& rois, int64_t batch) {
  check::dtype(kOp, "rois", rois, DType::f32);
  EMBER_CHECK(rois.ndim() == 2 && rois.size(1) == 5, ValueError, kOp,
              ": rois must be [K, 5] (batch index, x1, y1, x2, y2), got ", rois.describe());
  check::contiguous(kOp, "rois", rois);
  const float* r = rois.data_as<const float>();
  for (int64_t k = 0; k < rois.size(0); ++k) {
    const float b = r[5 * k];
    EMBER_CHECK(std::isfinite(b) && b >= 0 && b < static_cast<float>(batch) && b == std::floor(b), IndexError, kOp,
                ": rois[", k, "] has batch index ", b, ", not one of the input's ", batch, " images");
    for (int j = 1; j < 5; ++j) {
      EMBER_CHECK(std::isfinite(r[5 * k + j]), ValueError, kOp, ": rois[", k, "] has a non-finite coordinate");
    }
  }
}

// The strides of a [K, C, PH, PW] tensor's bins and channels, row-major or channels-last (else a ValueError).
std::pair<int64_t, int64_t> bin_and_channel_strides(std::string_view name, const TensorView& t, const Image& in,
                                                    int64_t rois, const RoiAlignOptions& o, DType dtype) {
  check::dtype(kOp, name, t, dtype);
  EMBER_CHECK(t.ndim() == 4 && t.size(0) == rois && t.size(1) == in.c && t.size(2) == o.pooled_height &&
                  t.size(3) == o.pooled_width,
              ValueError, kOp, ": ", name, " must be [", rois, ", ", in.c, ", ", o.pooled_height, ", ", o.pooled_width,
              "], got ", t.describe());
  if (t.is_contiguous()) return {1, o.pooled_height * o.pooled_width};
  EMBER_CHECK(t.is_dense() && t.stride(1) == 1, ValueError, kOp, ": ", name, " must be contiguous or channels-last");
  return {in.c, 1};
}

// A row-major image copied channels-last (position-major), in its own dtype.
template <typename W>
std::vector<W> to_channels_last(const W* src, const Image& im) {
  std::vector<W> dst(static_cast<size_t>(im.n * im.c * im.h * im.w));
  const int64_t hw = im.h * im.w;
  parallel_for(im.n * hw, 1 << 12, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = p / hw, q = p % hw;
      for (int64_t c = 0; c < im.c; ++c) dst[p * im.c + c] = src[(n * im.c + c) * hw + q];
    }
  });
  return dst;
}

template <typename W>
void forward_typed(const TensorView& input, const Image& im, const TensorView& rois, const RoiAlignOptions& o,
                   const TensorView& out, int64_t bin_stride, int64_t channel_stride) {
  std::vector<W> staged;
  const W* image = input.data_as<const W>();
  if (!im.channels_last && im.c > 1) {
    staged = to_channels_last(image, im);
    image = staged.data();
  }
  const auto& impl = select_impl(kPool<W>, active_isa());
  const int64_t bins = o.pooled_height * o.pooled_width, roi_stride = im.c * bins;
  const float* r = rois.data_as<const float>();
  parallel_for(rois.size(0), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    BoxTaps taps;
    for (int64_t k = begin; k < end; ++k) {
      box_taps(r + 5 * k, o, im, taps);
      const RoiTaps t{taps.position.data(), taps.weight.data(), bins, taps.taps_per_bin, taps.count};
      PoolArgs<W> a{image + taps.batch * im.h * im.w * im.c, im.c, out.data_as<W>() + k * roi_stride, bin_stride,
                    channel_stride};
      impl.fn(t, a);
    }
  });
}

template <typename W>
void backward_typed(const TensorView& grad_out, const TensorView& rois, const RoiAlignOptions& o, const Image& im,
                    const TensorView& grad_input, int64_t bin_stride, int64_t channel_stride) {
  const int64_t k_rois = rois.size(0), bins = o.pooled_height * o.pooled_width, hw = im.h * im.w;
  std::vector<BoxTaps> taps(static_cast<size_t>(k_rois));
  const float* r = rois.data_as<const float>();
  parallel_for(k_rois, 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) box_taps(r + 5 * k, o, im, taps[k]);
  });
  // The sums go to a float32 channels-last buffer: grad_input itself when it is one, else a scratch array.
  const int64_t elements = im.n * hw * im.c;
  constexpr bool kFloat = std::is_same_v<W, float>;
  std::vector<float> scratch;
  float* grad = nullptr;
  if (kFloat && im.channels_last) {
    grad = grad_input.data_as<float>();
    std::fill(grad, grad + elements, 0.0f);
  } else {
    scratch.assign(static_cast<size_t>(elements), 0.0f);
    grad = scratch.data();
  }
  const auto& impl = select_impl(kScatter<W>, active_isa());
  const int64_t blocks = (im.c + kChannelBlock - 1) / kChannelBlock;
  const W* g = grad_out.data_as<const W>();
  parallel_for(blocks, 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t k = 0; k < k_rois; ++k) {  // boxes in order: the sums do not depend on the thread count
      const BoxTaps& bt = taps[k];
      const RoiTaps t{bt.position.data(), bt.weight.data(), bins, bt.taps_per_bin, bt.count};
      ScatterArgs<W> a{grad + bt.batch * hw * im.c, im.c, g + k * im.c * bins, bin_stride, channel_stride};
      impl.fn(t, a, begin * kChannelBlock, std::min(end * kChannelBlock, im.c));
    }
  });
  if (kFloat && im.channels_last) return;
  W* dst = grad_input.data_as<W>();
  if constexpr (!kFloat) {
    if (im.channels_last) return bf16::round(grad, dst, elements);
  }
  // A row-major grad_input: the channels-last sums transposed (and rounded for bfloat16).
  parallel_for(im.n * hw, 1 << 12, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = p / hw, q = p % hw;
      for (int64_t c = 0; c < im.c; ++c) {
        const float v = grad[p * im.c + c];
        W* at = dst + (n * im.c + c) * hw + q;
        if constexpr (kFloat) {
          *at = v;
        } else {
          *at = bf16::round_bits(bf16::float_bits(v));
        }
      }
    }
  });
}

}  // namespace

Isa roi_align_implementation() { return select_impl(kPool<float>, active_isa()).isa; }

void roi_align_forward(const TensorView& input, const TensorView& rois, const RoiAlignOptions& options,
                       const TensorView& out) {
  check_options(options);
  const Image im = check_image("input", input);
  check_rois(rois, im.n);
  const auto [bin_stride, channel_stride] =
      bin_and_channel_strides("out", out, im, rois.size(0), options, input.dtype());
  check::no_overlap(kOp, "out", out, "input", input);
  check::no_overlap(kOp, "out", out, "rois", rois);
  if (input.dtype() == DType::f32) {
    forward_typed<float>(input, im, rois, options, out, bin_stride, channel_stride);
  } else {
    forward_typed<uint16_t>(input, im, rois, options, out, bin_stride, channel_stride);
  }
}

void roi_align_backward(const TensorView& grad_out, const TensorView& rois, const RoiAlignOptions& options,
                        const TensorView& grad_input) {
  check_options(options);
  const Image im = check_image("grad_input", grad_input);
  check_rois(rois, im.n);
  const auto [bin_stride, channel_stride] =
      bin_and_channel_strides("grad_out", grad_out, im, rois.size(0), options, grad_input.dtype());
  check::no_overlap(kOp, "grad_input", grad_input, "grad_out", grad_out);
  check::no_overlap(kOp, "grad_input", grad_input, "rois", rois);
  if (grad_input.dtype() == DType::f32) {
    backward_typed<float>(grad_out, rois, options, im, grad_input, bin_stride, channel_stride);
  } else {
    backward_typed<uint16_t>(grad_out, rois, options, im, grad_input, bin_stride, channel_stride);
  }
}

}  // namespace ember::vision
