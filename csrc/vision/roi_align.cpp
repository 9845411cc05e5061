// roi_align: argument checks, each box's sample taps in torchvision's arithmetic, the channels-last staging of a
// row-major image, and the parallel split (boxes in the forward, channel blocks in the backward). The per-channel
// arithmetic lives in roi_align_body.inl.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/bf16.h"
#include "ember/checked.h"
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

// The body for storage W at `isa`: float64 takes its one path (roi_align_f64.cpp) on every machine, the others their
// ISA's. (A float64 entry in the tables above would name ISA paths that do not exist.)
template <typename W>
PoolFn<W> pool_fn(Isa isa) {
  if constexpr (std::is_same_v<W, double>) {
    return roi_pool_f64;
  } else {
    return select_impl(kPool<W>, isa).fn;
  }
}
template <typename W>
ScatterFn<W> scatter_fn(Isa isa) {
  if constexpr (std::is_same_v<W, double>) {
    return roi_scatter_f64;
  } else {
    return select_impl(kScatter<W>, isa).fn;
  }
}

// Channels a backward task owns: enough for whole vectors, small enough that 256 channels feed 16 threads.
constexpr int64_t kChannelBlock = 16;
// The most sample taps one box may take (12-16 bytes each: 32 GiB at this bound). torchvision would loop over them
// for minutes; a sampling_ratio near 2^31 would make 2^64 of them.
constexpr int64_t kMaxTapsPerBox = int64_t{1} << 31;

struct Image {
  int64_t n = 0, c = 0, h = 0, w = 0;
  bool channels_last = false;
};

Image check_image(std::string_view name, const TensorView& t) {
  EMBER_CHECK(t.ndim() == 4, ValueError, kOp, ": ", name, " must be 4-D [N, C, H, W], got ", t.describe());
  EMBER_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f64, TypeError, kOp, ": ",
              name, " must have dtype float32, bfloat16 or float64, got ", dtype_name(t.dtype()));
  Image im{t.size(0), t.size(1), t.size(2), t.size(3), false};
  if (t.is_contiguous()) return im;
  const bool nhwc = t.is_dense() && t.stride(1) == 1 && t.stride(3) == im.c && t.stride(2) == im.w * im.c;
  EMBER_CHECK(nhwc, ValueError, kOp, ": ", name, " must be contiguous or channels-last, got a ", t.describe(),
              " view with other strides");
  im.channels_last = true;
  return im;
}

// One box's taps, in torchvision's CPU arithmetic for type R (roi_align_kernel.cpp: the box in R from double
// products, pre_calc_for_bilinear_interpolate for the samples): float for float32 and bfloat16, double for float64.
template <typename R>
struct BoxTaps {
  int64_t batch = 0;
  std::vector<int64_t> position;
  std::vector<R> weight;
  int64_t taps_per_bin = 0;
  R count = 1;

  RoiTaps<R> view(int64_t bins) const { return {position.data(), weight.data(), bins, taps_per_bin, count}; }
};

// A box in image coordinates and its sample grid, in torchvision's arithmetic for type R: the box in R from double
// products (roi_align_kernel.cpp), the grid sampling_ratio or ceil(box size / bins) when that is <= 0.
template <typename R>
struct BoxGrid {
  R start_w = 0, start_h = 0, bin_w = 0, bin_h = 0;
  int64_t grid_h = 0, grid_w = 0;  // may be <= 0 (a reversed aligned box): no samples
};

template <typename R>
BoxGrid<R> box_grid(const R* roi, const RoiAlignOptions& o) {
  BoxGrid<R> g;
  const R offset = o.aligned ? R{0.5} : R{0};
  g.start_w = static_cast<R>(roi[1] * o.spatial_scale - offset);
  g.start_h = static_cast<R>(roi[2] * o.spatial_scale - offset);
  const auto end_w = static_cast<R>(roi[3] * o.spatial_scale - offset);
  const auto end_h = static_cast<R>(roi[4] * o.spatial_scale - offset);
  R roi_w = end_w - g.start_w, roi_h = end_h - g.start_h;
  if (!o.aligned) {
    roi_w = std::max(roi_w, R{1});
    roi_h = std::max(roi_h, R{1});
  }
  g.bin_h = roi_h / static_cast<R>(o.pooled_height);
  g.bin_w = roi_w / static_cast<R>(o.pooled_width);
  // checked: a finite box scaled by a large spatial_scale can be too large (or infinite) for int64
  if (o.sampling_ratio > 0) {
    g.grid_h = g.grid_w = o.sampling_ratio;
  } else {
    g.grid_h = checked::to_int64(kOp, "a box's sample grid height", std::ceil(roi_h / o.pooled_height));
    g.grid_w = checked::to_int64(kOp, "a box's sample grid width", std::ceil(roi_w / o.pooled_width));
  }
  return g;
}

// The taps one box stores: four a sample, grid_h x grid_w samples a bin. Checked, so that a sampling ratio near
// 2^31 or a huge box is refused before anything is allocated.
template <typename R>
int64_t box_tap_count(const BoxGrid<R>& g, const RoiAlignOptions& o, int64_t k) {
  const int64_t taps = checked::mul(kOp, "the sample taps of a box", 4, o.pooled_height, o.pooled_width,
                                    std::max<int64_t>(g.grid_h, 0), std::max<int64_t>(g.grid_w, 0));
  EMBER_CHECK(taps <= kMaxTapsPerBox, ValueError, kOp, ": rois[", k, "] needs ", taps,
              " sample taps (output_size x sampling grid x 4), more than the ", kMaxTapsPerBox,
              " one box may take; give a smaller sampling_ratio");
  return taps;
}

template <typename R>
void box_taps(const R* roi, const RoiAlignOptions& o, const Image& im, BoxTaps<R>& out) {
  out.batch = static_cast<int64_t>(roi[0]);
  const BoxGrid<R> g = box_grid(roi, o);
  const R start_w = g.start_w, start_h = g.start_h, bin_h = g.bin_h, bin_w = g.bin_w;
  const int64_t grid_h = g.grid_h, grid_w = g.grid_w;
  // torchvision divides by max(grid_h * grid_w, 1); a grid with a side <= 0 has no samples, so 1 gives its zeros
  // without forming a product of two negative sides. The positive product is bounded by box_tap_count's check.
  out.count = static_cast<R>(grid_h > 0 && grid_w > 0 ? grid_h * grid_w : 1);
  out.taps_per_bin = 4 * std::max<int64_t>(grid_h, 0) * std::max<int64_t>(grid_w, 0);
  const int64_t bins = o.pooled_height * o.pooled_width;
  out.position.assign(static_cast<size_t>(bins * out.taps_per_bin), 0);
  out.weight.assign(static_cast<size_t>(bins * out.taps_per_bin), R{0});
  const auto height = static_cast<R>(im.h), width = static_cast<R>(im.w);
  int64_t k = 0;
  for (int64_t ph = 0; ph < o.pooled_height; ++ph) {
    for (int64_t pw = 0; pw < o.pooled_width; ++pw) {
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const R yy =
            start_h + static_cast<R>(ph) * bin_h + (static_cast<R>(iy) + R(0.5)) * bin_h / static_cast<R>(grid_h);
        for (int64_t ix = 0; ix < grid_w; ++ix, k += 4) {
          const R xx =
              start_w + static_cast<R>(pw) * bin_w + (static_cast<R>(ix) + R(0.5)) * bin_w / static_cast<R>(grid_w);
          R y = yy, x = xx;
          if (y < -1 || y > height || x < -1 || x > width) continue;  // zero weights
          if (im.h == 0 || im.w == 0) continue;  // an empty image has nothing to sample (zero weights)
          if (y <= 0) y = 0;
          if (x <= 0) x = 0;
          auto y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x);
          int64_t y_high, x_high;
          if (y_low >= im.h - 1) {
            y_high = y_low = im.h - 1;
            y = static_cast<R>(y_low);
          } else {
            y_high = y_low + 1;
          }
          if (x_low >= im.w - 1) {
            x_high = x_low = im.w - 1;
            x = static_cast<R>(x_low);
          } else {
            x_high = x_low + 1;
          }
          const R ly = y - static_cast<R>(y_low), lx = x - static_cast<R>(x_low);
          const R hy = 1 - ly, hx = 1 - lx;
          const int64_t base = k;  // taps run bin by bin, sample by sample, four a sample
          const int64_t pos[4] = {y_low * im.w + x_low, y_low * im.w + x_high, y_high * im.w + x_low,
                                  y_high * im.w + x_high};
          const R wt[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
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

template <typename R>
void check_roi_values(const R* r, int64_t count, int64_t batch, const RoiAlignOptions& o) {
  for (int64_t k = 0; k < count; ++k) {
    const R b = r[5 * k];
    EMBER_CHECK(std::isfinite(b) && b >= 0 && b < static_cast<R>(batch) && b == std::floor(b), IndexError, kOp,
                ": rois[", k, "] has batch index ", b, ", not one of the input's ", batch, " images");
    for (int j = 1; j < 5; ++j) {
      EMBER_CHECK(std::isfinite(r[5 * k + j]), ValueError, kOp, ": rois[", k, "] has a non-finite coordinate");
    }
    const BoxGrid<R> g = box_grid(r + 5 * k, o);
    EMBER_CHECK(
        std::isfinite(g.start_h) && std::isfinite(g.start_w) && std::isfinite(g.bin_h) && std::isfinite(g.bin_w),
        ValueError, kOp, ": rois[", k, "] scaled by spatial_scale (", o.spatial_scale,
        ") is not finite in the image's arithmetic type");
    box_tap_count(g, o, k);
  }
}

// rois: [K, 5] of the arithmetic dtype (float32, float64 for a float64 image), each naming one of `batch` images.
void check_rois(const TensorView& rois, int64_t batch, DType image, const RoiAlignOptions& o) {
  check::dtype(kOp, "rois", rois, arithmetic_dtype(image));
  EMBER_CHECK(rois.ndim() == 2 && rois.size(1) == 5, ValueError, kOp,
              ": rois must be [K, 5] (batch index, x1, y1, x2, y2), got ", rois.describe());
  check::contiguous(kOp, "rois", rois);
  if (rois.dtype() == DType::f64) {
    check_roi_values(rois.data_as<const double>(), rois.size(0), batch, o);
  } else {
    check_roi_values(rois.data_as<const float>(), rois.size(0), batch, o);
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

// What forward and backward check alike: the options, the image ([N, C, H, W]: the input, or grad_input), rois of
// its batch and arithmetic, the [K, C, PH, PW] tensor of bins (out, or grad_out) of the image's dtype, and that the
// written one of the two (the bins when bins_written, else the image) overlaps neither the other nor rois.
struct Call {
  Image im;
  int64_t bin_stride = 0, channel_stride = 0;
};

Call check_call(const RoiAlignOptions& o, std::string_view image_name, const TensorView& image, const TensorView& rois,
                std::string_view bins_name, const TensorView& bins, bool bins_written) {
  check_options(o);
  Call c;
  c.im = check_image(image_name, image);
  check_rois(rois, c.im.n, image.dtype(), o);
  std::tie(c.bin_stride, c.channel_stride) =
      bin_and_channel_strides(bins_name, bins, c.im, rois.size(0), o, image.dtype());
  const auto& [written_name, written] = bins_written ? std::pair(bins_name, &bins) : std::pair(image_name, &image);
  const auto& [read_name, read] = bins_written ? std::pair(image_name, &image) : std::pair(bins_name, &bins);
  check::no_overlap(kOp, written_name, *written, read_name, *read);
  check::no_overlap(kOp, written_name, *written, "rois", rois);
  return c;
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
  using R = Arithmetic<W>;
  const PoolFn<W> pool = pool_fn<W>(active_isa());
  const int64_t bins = o.pooled_height * o.pooled_width, roi_stride = im.c * bins;
  const R* r = rois.data_as<const R>();
  parallel_for(rois.size(0), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    BoxTaps<R> taps;
    for (int64_t k = begin; k < end; ++k) {
      box_taps(r + 5 * k, o, im, taps);
      PoolArgs<W> a{image + taps.batch * im.h * im.w * im.c, im.c, out.data_as<W>() + k * roi_stride, bin_stride,
                    channel_stride};
      pool(taps.view(bins), a);
    }
  });
}

template <typename W>
void backward_typed(const TensorView& grad_out, const TensorView& rois, const RoiAlignOptions& o, const Image& im,
                    const TensorView& grad_input, int64_t bin_stride, int64_t channel_stride) {
  using R = Arithmetic<W>;
  const int64_t k_rois = rois.size(0), bins = o.pooled_height * o.pooled_width, hw = im.h * im.w;
  std::vector<BoxTaps<R>> taps(static_cast<size_t>(k_rois));
  const R* r = rois.data_as<const R>();
  parallel_for(k_rois, 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) box_taps(r + 5 * k, o, im, taps[k]);
  });
  // The sums go to a channels-last buffer of R: grad_input itself when it is one, else a scratch array.
  const int64_t elements = im.n * hw * im.c;
  constexpr bool kExact = std::is_same_v<W, R>;  // float32 or float64: no rounding to the storage type
  std::vector<R> scratch;
  R* grad = nullptr;
  if (kExact && im.channels_last) {
    grad = grad_input.data_as<R>();
    std::fill(grad, grad + elements, R{0});
  } else {
    scratch.assign(static_cast<size_t>(elements), R{0});
    grad = scratch.data();
  }
  const ScatterFn<W> scatter = scatter_fn<W>(active_isa());
  const int64_t blocks = (im.c + kChannelBlock - 1) / kChannelBlock;
  const W* g = grad_out.data_as<const W>();
  parallel_for(blocks, 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t k = 0; k < k_rois; ++k) {  // boxes in order: the sums do not depend on the thread count
      const BoxTaps<R>& bt = taps[k];
      ScatterArgs<W> a{grad + bt.batch * hw * im.c, im.c, g + k * im.c * bins, bin_stride, channel_stride};
      scatter(bt.view(bins), a, begin * kChannelBlock, std::min(end * kChannelBlock, im.c));
    }
  });
  if (kExact && im.channels_last) return;
  W* dst = grad_input.data_as<W>();
  if constexpr (!kExact) {
    if (im.channels_last) return bf16::round(grad, dst, elements);
  }
  // A row-major grad_input: the channels-last sums transposed (and rounded for bfloat16).
  parallel_for(im.n * hw, 1 << 12, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = p / hw, q = p % hw;
      for (int64_t c = 0; c < im.c; ++c) {
        const R v = grad[p * im.c + c];
        W* at = dst + (n * im.c + c) * hw + q;
        if constexpr (kExact) {
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
  const Call c = check_call(options, "input", input, rois, "out", out, true);
  with_float_storage(input.dtype(), [&](auto w) {
    forward_typed<decltype(w)>(input, c.im, rois, options, out, c.bin_stride, c.channel_stride);
  });
}

void roi_align_backward(const TensorView& grad_out, const TensorView& rois, const RoiAlignOptions& options,
                        const TensorView& grad_input) {
  const Call c = check_call(options, "grad_input", grad_input, rois, "grad_out", grad_out, false);
  with_float_storage(grad_input.dtype(), [&](auto w) {
    backward_typed<decltype(w)>(grad_out, rois, options, c.im, grad_input, c.bin_stride, c.channel_stride);
  });
}

}  // namespace ember::vision
