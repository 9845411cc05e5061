// Frozen batch norm: every ISA path, both layouts and every dtype pair against a double-precision reference of
// ember/norm.h, in place, the backward, and argument checks that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/norm.h"
#include "isa_test_util.h"

namespace ember {
namespace {

struct Buffers {
  std::vector<float> weight, bias, mean, var;
  explicit Buffers(int64_t c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < c; ++i) {
      weight.push_back(normal(rng));
      bias.push_back(normal(rng));
      mean.push_back(normal(rng));
      var.push_back(std::fabs(normal(rng)) + 0.1f);
    }
  }
  TensorView view(std::vector<float>& v) { return TensorView(v.data(), DType::f32, {static_cast<int64_t>(v.size())}); }
  double scale(int64_t c, double eps) const { return weight[c] / std::sqrt(double(var[c]) + eps); }
  double shift(int64_t c, double eps) const { return bias[c] - mean[c] * scale(c, eps); }
};

// [N, C, H, W] values (bf16-exact) stored row-major or channels-last; value(n, c, h, w) reads either.
struct Image {
  int64_t n, c, h, w;
  bool channels_last;
  std::vector<float> f;
  std::vector<uint16_t> b;
  Image(int64_t n_, int64_t c_, int64_t h_, int64_t w_, bool cl, uint32_t seed)
      : n(n_), c(c_), h(h_), w(w_), channels_last(cl) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < n * c * h * w; ++i) {
      const float v = bf16::widen(bf16::round_bits(bf16::float_bits(normal(rng))));
      f.push_back(v);
      b.push_back(static_cast<uint16_t>(bf16::float_bits(v) >> 16));
    }
  }
  std::vector<int64_t> strides() const {
    return channels_last ? std::vector<int64_t>{h * w * c, 1, w * c, c} : std::vector<int64_t>{c * h * w, h * w, w, 1};
  }
  TensorView view(bool bf16) {
    const int64_t sizes[4] = {n, c, h, w};
    const auto st = strides();
    return bf16 ? TensorView(b.data(), DType::bf16, sizes, st.data(), 4)
                : TensorView(f.data(), DType::f32, sizes, st.data(), 4);
  }
  int64_t offset(int64_t i, int64_t j, int64_t k, int64_t l) const {
    const auto st = strides();
    return i * st[0] + j * st[1] + k * st[2] + l * st[3];
  }
};

TEST(FrozenBatchNorm, EveryLayoutAndDtypeMatchesTheDefinitionOnEveryPath) {
  const double eps = 1e-5;
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (bool channels_last : {false, true}) {
      for (auto [in_bf16, out_bf16] : {std::pair{false, false}, {true, false}, {true, true}}) {
        Image x(2, 19, 5, 7, channels_last, 1);
        Buffers p(19, 2);
        Image out(2, 19, 5, 7, channels_last, 3);
        norm::frozen_batch_norm(x.view(in_bf16), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var), eps,
                                out.view(out_bf16));
        Image grad_x(2, 19, 5, 7, channels_last, 4);
        norm::frozen_batch_norm_backward(x.view(in_bf16), p.view(p.weight), p.view(p.var), eps, grad_x.view(out_bf16));
        const double tol = out_bf16 ? 1.0 / 128 : 1e-5;
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t c = 0; c < 19; ++c) {
            for (int64_t k = 0; k < 35; ++k) {
              const int64_t at = x.offset(i, c, k / 7, k % 7);
              const double expect = x.f[at] * p.scale(c, eps) + p.shift(c, eps);
              const double got = out_bf16 ? bf16::widen(out.b[at]) : out.f[at];
              ASSERT_NEAR(got, expect, tol * (1 + std::fabs(expect))) << isa_name(isa) << " channel " << c;
              const double grad_expect = x.f[at] * p.scale(c, eps);
              const double grad_got = out_bf16 ? bf16::widen(grad_x.b[at]) : grad_x.f[at];
              ASSERT_NEAR(grad_got, grad_expect, tol * (1 + std::fabs(grad_expect)));
            }
          }
        }
      }
    }
  }
}

// With relu, max(y, 0) of the same map, NaN kept: an eval-mode BatchNorm and its ReLU in one pass.
TEST(FrozenBatchNorm, TheReluVariantRectifiesAndKeepsNanOnEveryPath) {
  const double eps = 1e-5;
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (bool channels_last : {false, true}) {
      for (auto [in_bf16, out_bf16] : {std::pair{false, false}, {true, false}, {true, true}}) {
        Image x(2, 37, 3, 5, channels_last, 1);
        x.f[x.offset(1, 20, 2, 3)] = NAN;
        x.b[x.offset(1, 20, 2, 3)] = 0x7FC0;
        Buffers p(37, 2);
        Image out(2, 37, 3, 5, channels_last, 3);
        norm::frozen_batch_norm(x.view(in_bf16), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var), eps,
                                out.view(out_bf16), true);
        const double tol = out_bf16 ? 1.0 / 128 : 1e-5;
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t c = 0; c < 37; ++c) {
            for (int64_t k = 0; k < 15; ++k) {
              const int64_t at = x.offset(i, c, k / 5, k % 5);
              const double expect = std::max(x.f[at] * p.scale(c, eps) + p.shift(c, eps), 0.0);
              const double got = out_bf16 ? bf16::widen(out.b[at]) : out.f[at];
              if (std::isnan(x.f[at])) {
                ASSERT_TRUE(std::isnan(got)) << isa_name(isa);
                continue;
              }
              ASSERT_NEAR(got, expect, tol * (1 + std::fabs(expect))) << isa_name(isa) << " channel " << c;
            }
          }
        }
      }
    }
  }
  std::vector<double> d(4, 1.0), w(1, 1.0), zero(1, 0.0), one(1, 1.0);
  const TensorView x64(d.data(), DType::f64, {1, 1, 2, 2});
  EXPECT_THROW(norm::frozen_batch_norm(
                   x64, TensorView(w.data(), DType::f64, {1}), TensorView(zero.data(), DType::f64, {1}),
                   TensorView(zero.data(), DType::f64, {1}), TensorView(one.data(), DType::f64, {1}), 1e-5, x64, true),
               ValueError);
}

// float64 x and buffers run one double path under every ISA cap: forward and backward equal the definition to
// double rounding on both layouts (normal doubles, so a float32 step anywhere would show).
TEST(FrozenBatchNorm, Float64ComputesInDoubleOnEveryPath) {
  const int64_t n = 2, c = 19, h = 3, w = 5, size = n * c * h * w;
  std::mt19937 rng(12);
  std::normal_distribution<double> normal;
  std::vector<double> x(size), weight(c), bias(c), mean(c), var(c);
  for (double& v : x) v = normal(rng);
  for (int64_t k = 0; k < c; ++k) {
    weight[k] = normal(rng);
    bias[k] = normal(rng);
    mean[k] = normal(rng);
    var[k] = std::fabs(normal(rng)) + 0.1;
  }
  auto vec = [&](std::vector<double>& v) { return TensorView(v.data(), DType::f64, {c}); };
  const double eps = 1e-5;
  for (bool channels_last : {false, true}) {
    const int64_t sizes[4] = {n, c, h, w};
    const int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc[4] = {h * w * c, 1, w * c, c};
    const int64_t* strides = channels_last ? nhwc : nchw;
    for (Isa isa : testing::supported_isas()) {
      testing::ScopedIsaCap cap(isa);
      std::vector<double> y(size), gx(size);
      const TensorView xv(x.data(), DType::f64, sizes, strides, 4);
      norm::frozen_batch_norm(xv, vec(weight), vec(bias), vec(mean), vec(var), eps,
                              TensorView(y.data(), DType::f64, sizes, strides, 4));
      norm::frozen_batch_norm_backward(xv, vec(weight), vec(var), eps,
                                       TensorView(gx.data(), DType::f64, sizes, strides, 4));
      for (int64_t i = 0; i < size; ++i) {
        const int64_t ch = channels_last ? i % c : (i / (h * w)) % c;
        const double scale = weight[ch] / std::sqrt(var[ch] + eps);
        const double expect = x[i] * scale + (bias[ch] - mean[ch] * scale);
        ASSERT_NEAR(y[i], expect, 1e-14 * (1 + std::fabs(expect))) << isa_name(isa) << " element " << i;
        ASSERT_NEAR(gx[i], x[i] * scale, 1e-14 * (1 + std::fabs(x[i] * scale))) << isa_name(isa);
      }
    }
  }
  // float64 x takes float64 buffers and gives float64.
  std::vector<float> weight32(weight.begin(), weight.end());
  std::vector<double> y(size);
  const TensorView xv(x.data(), DType::f64, {n, c, h, w});
  EXPECT_THROW(norm::frozen_batch_norm(xv, TensorView(weight32.data(), DType::f32, {c}), vec(bias), vec(mean), vec(var),
                                       eps, TensorView(y.data(), DType::f64, {n, c, h, w})),
               TypeError);
  std::vector<float> y32(size);
  EXPECT_THROW(norm::frozen_batch_norm(xv, vec(weight), vec(bias), vec(mean), vec(var), eps,
                                       TensorView(y32.data(), DType::f32, {n, c, h, w})),
               TypeError);
}

TEST(FrozenBatchNorm, InPlaceAndBadArguments) {
  Image x(1, 4, 3, 3, false, 5);
  Buffers p(4, 6);
  const std::vector<float> before = x.f;
  norm::frozen_batch_norm(x.view(false), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var), 1e-5,
                          x.view(false));
  EXPECT_NEAR(x.f[0], before[0] * p.scale(0, 1e-5) + p.shift(0, 1e-5), 1e-5);
  Image y(1, 4, 3, 3, false, 7);
  const std::vector<float> y_before = y.f;
  Buffers three(3, 8);
  EXPECT_THROW(norm::frozen_batch_norm(x.view(false), three.view(three.weight), p.view(p.bias), p.view(p.mean),
                                       p.view(p.var), 1e-5, y.view(false)),
               ValueError);
  EXPECT_THROW(norm::frozen_batch_norm(x.view(false), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var),
                                       -1.0, y.view(false)),
               ValueError);
  Image other_layout(1, 4, 3, 3, true, 9);
  EXPECT_THROW(norm::frozen_batch_norm(x.view(false), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var),
                                       1e-5, other_layout.view(false)),
               ValueError);
  EXPECT_THROW(norm::frozen_batch_norm(x.view(false), p.view(p.weight), p.view(p.bias), p.view(p.mean), p.view(p.var),
                                       1e-5, y.view(true)),
               TypeError);  // float32 in, bfloat16 out
  EXPECT_EQ(y.f, y_before);
}

}  // namespace
}  // namespace ember
