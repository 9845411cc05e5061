// roi_align: every ISA path against the reference path on both layouts (forward and backward), the float64 path as
// the forward's adjoint, and argument checks. Python's test_roi_align.py compares with a transcription of torchvision's
// kernel and with torchvision.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "ember/errors.h"
#include "ember/vision.h"
#include "isa_test_util.h"

namespace ember {
namespace {

constexpr int64_t kN = 2, kC = 21, kH = 11, kW = 13, kRois = 6, kPH = 3, kPW = 4;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> random_rois() {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> pos(-2, 12), size(0, 9);
  std::vector<float> r;
  for (int64_t k = 0; k < kRois; ++k) {
    const float x = pos(rng), y = pos(rng);
    r.insert(r.end(), {static_cast<float>(k % kN), x, y, x + size(rng), y + size(rng)});
  }
  return r;
}

template <typename T>
TensorView image_view(std::vector<T>& data, bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t sizes[4] = {n, c, h, w};
  const int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc[4] = {h * w * c, 1, w * c, c};
  const DType dtype = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  return TensorView(data.data(), dtype, sizes, channels_last ? nhwc : nchw, 4);
}

vision::RoiAlignOptions options(int64_t ratio, bool aligned) {
  vision::RoiAlignOptions o;
  o.spatial_scale = 0.9;
  o.pooled_height = kPH;
  o.pooled_width = kPW;
  o.sampling_ratio = ratio;
  o.aligned = aligned;
  return o;
}

// Forward then backward (with a fixed output gradient) under the current ISA cap; returns both, row-major order of
// their own layouts.
std::pair<std::vector<float>, std::vector<float>> run(bool channels_last, int64_t ratio, bool aligned) {
  std::vector<float> input = random_values(kN * kC * kH * kW, 1), rois = random_rois();
  std::vector<float> out(kRois * kC * kPH * kPW), grad_out = random_values(out.size(), 2), grad_in(input.size());
  const vision::RoiAlignOptions o = options(ratio, aligned);
  const TensorView r(rois.data(), DType::f32, {kRois, 5});
  vision::roi_align_forward(image_view(input, channels_last, kN, kC, kH, kW), r, o,
                            image_view(out, channels_last, kRois, kC, kPH, kPW));
  vision::roi_align_backward(image_view(grad_out, channels_last, kRois, kC, kPH, kPW), r, o,
                             image_view(grad_in, channels_last, kN, kC, kH, kW));
  return {out, grad_in};
}

TEST(RoiAlign, EveryPathMatchesTheReferencePath) {
  for (bool channels_last : {false, true}) {
    for (auto [ratio, aligned] : {std::pair<int64_t, bool>{2, false}, {0, true}, {-1, false}}) {
      std::pair<std::vector<float>, std::vector<float>> ref;
      {
        testing::ScopedIsaCap cap(Isa::ref);
        ref = run(channels_last, ratio, aligned);
      }
      for (Isa isa : testing::supported_isas()) {
        testing::ScopedIsaCap cap(isa);
        const auto got = run(channels_last, ratio, aligned);
        for (size_t i = 0; i < ref.first.size(); ++i) {
          ASSERT_NEAR(got.first[i], ref.first[i], 1e-5 * (1 + std::fabs(ref.first[i]))) << isa_name(isa);
        }
        for (size_t i = 0; i < ref.second.size(); ++i) {
          ASSERT_NEAR(got.second[i], ref.second[i], 1e-5 * (1 + std::fabs(ref.second[i]))) << isa_name(isa);
        }
      }
    }
  }
}

// float64 runs one double path under every ISA cap. roi_align is linear in its input, so the backward is the
// forward's adjoint: <grad_out, forward(x)> = <backward(grad_out), x>, which holds to double rounding only if both
// directions use the same taps in double. The values agree with the float32 path to float32 rounding.
TEST(RoiAlign, Float64IsTheForwardsAdjointInDoubleOnEveryPath) {
  for (bool channels_last : {false, true}) {
    for (auto [ratio, aligned] : {std::pair<int64_t, bool>{2, false}, {0, true}, {-1, false}}) {
      const std::vector<float> input32 = random_values(kN * kC * kH * kW, 1), rois32 = random_rois();
      std::vector<double> input(input32.begin(), input32.end()), rois(rois32.begin(), rois32.end());
      std::vector<double> grad_out(kRois * kC * kPH * kPW);
      std::mt19937 rng(8);
      std::normal_distribution<double> normal;
      for (double& g : grad_out) g = normal(rng);
      const vision::RoiAlignOptions o = options(ratio, aligned);
      const std::vector<float> out32 = run(channels_last, ratio, aligned).first;
      for (Isa isa : testing::supported_isas()) {
        testing::ScopedIsaCap cap(isa);
        std::vector<double> out(grad_out.size()), grad_in(input.size(), 5.0);
        const TensorView r(rois.data(), DType::f64, {kRois, 5});
        vision::roi_align_forward(image_view(input, channels_last, kN, kC, kH, kW), r, o,
                                  image_view(out, channels_last, kRois, kC, kPH, kPW));
        vision::roi_align_backward(image_view(grad_out, channels_last, kRois, kC, kPH, kPW), r, o,
                                   image_view(grad_in, channels_last, kN, kC, kH, kW));
        double forward_dot = 0, backward_dot = 0, scale = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          forward_dot += grad_out[i] * out[i];
          scale += std::fabs(grad_out[i] * out[i]);
          ASSERT_NEAR(out[i], out32[i], 1e-5 * (1 + std::fabs(out[i]))) << isa_name(isa);
        }
        for (size_t i = 0; i < input.size(); ++i) backward_dot += grad_in[i] * input[i];
        EXPECT_NEAR(forward_dot, backward_dot, 1e-13 * scale) << isa_name(isa) << " ratio " << ratio;
      }
    }
  }
}

TEST(RoiAlign, BadArguments) {
  std::vector<float> input = random_values(kN * kC * kH * kW, 1), out(kC * kPH * kPW, -3.0f);
  std::vector<float> bad_batch = {2, 0, 0, 4, 4}, good = {0, 0, 0, 4, 4};
  vision::RoiAlignOptions o;
  o.pooled_height = kPH;
  o.pooled_width = kPW;
  const TensorView in = image_view(input, false, kN, kC, kH, kW), o_view = image_view(out, false, 1, kC, kPH, kPW);
  EXPECT_THROW(vision::roi_align_forward(in, TensorView(bad_batch.data(), DType::f32, {1, 5}), o, o_view), IndexError);
  EXPECT_THROW(vision::roi_align_forward(in, TensorView(good.data(), DType::f32, {1, 4}), o, o_view), ValueError);
  std::vector<double> good64(good.begin(), good.end());  // float64 rois belong to a float64 image
  EXPECT_THROW(vision::roi_align_forward(in, TensorView(good64.data(), DType::f64, {1, 5}), o, o_view), TypeError);
  vision::RoiAlignOptions zero = o;
  zero.pooled_width = 0;
  EXPECT_THROW(vision::roi_align_forward(in, TensorView(good.data(), DType::f32, {1, 5}), zero, o_view), ValueError);
  for (float v : out) EXPECT_EQ(v, -3.0f);
}

// Regressions: a sampling ratio near 2^31 made 2^64 taps a box (the size wrapped before anything was checked and
// the process crashed), and so does a box scaled past int64 by spatial_scale; both are refused, nothing written.
TEST(RoiAlign, SamplingGridsTooLargeAreRefusedBeforeAnythingIsWritten) {
  std::vector<float> input = random_values(kN * kC * kH * kW, 1), out(kC * kPH * kPW, -3.0f);
  std::vector<float> box = {0, 1, 1, 8, 8};
  const TensorView in = image_view(input, false, kN, kC, kH, kW), o_view = image_view(out, false, 1, kC, kPH, kPW);
  const TensorView r(box.data(), DType::f32, {1, 5});
  const std::vector<float> input_before = input;
  for (int64_t ratio : {int64_t{1} << 31, int64_t{1} << 20, std::numeric_limits<int64_t>::max()}) {
    vision::RoiAlignOptions o = options(ratio, false);
    EXPECT_THROW(vision::roi_align_forward(in, r, o, o_view), ValueError) << ratio;
    EXPECT_THROW(vision::roi_align_backward(o_view, r, o, in), ValueError) << ratio;
  }
  vision::RoiAlignOptions huge = options(0, false);
  huge.spatial_scale = 1e30;  // adaptive grid: ceil(box / bins) of ~1e30 does not fit int64
  EXPECT_THROW(vision::roi_align_forward(in, r, huge, o_view), ValueError);
  huge.spatial_scale = 1e38;  // the scaled box overflows float32 to infinity
  EXPECT_THROW(vision::roi_align_forward(in, r, huge, o_view), ValueError);
  for (float v : out) EXPECT_EQ(v, -3.0f);
  EXPECT_EQ(input, input_before);  // the backward's grad_input, refused too
}

// Regression: an image of zero height (or width) made every sample's row index -1 and the kernel read before the
// image (SIGSEGV). Every sample is outside an empty image: the pooled values are zeros, and so is the gradient.
TEST(RoiAlign, AnEmptyImagePoolsZerosOnEveryPath) {
  for (auto [h, w] : {std::pair<int64_t, int64_t>{0, kW}, {kH, 0}, {0, 0}}) {
    for (bool channels_last : {false, true}) {
      for (Isa isa : testing::supported_isas()) {
        testing::ScopedIsaCap cap(isa);
        std::vector<float> input(static_cast<size_t>(kN * kC * h * w)), rois = random_rois();
        std::vector<float> out(kRois * kC * kPH * kPW, -3.0f), grad_out = random_values(out.size(), 2);
        const TensorView r(rois.data(), DType::f32, {kRois, 5});
        for (auto [ratio, aligned] : {std::pair<int64_t, bool>{2, false}, {0, true}, {-1, false}}) {
          const vision::RoiAlignOptions o = options(ratio, aligned);
          vision::roi_align_forward(image_view(input, channels_last, kN, kC, h, w), r, o,
                                    image_view(out, channels_last, kRois, kC, kPH, kPW));
          for (float v : out) ASSERT_EQ(v, 0.0f) << isa_name(isa);
          vision::roi_align_backward(image_view(grad_out, channels_last, kRois, kC, kPH, kPW), r, o,
                                     image_view(input, channels_last, kN, kC, h, w));
        }
      }
    }
  }
}

}  // namespace
}  // namespace ember
