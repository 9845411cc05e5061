// Dot interaction: every ISA path against a double-precision reference of ember/interaction.h (forward and
// backward, float32, bfloat16 and float64), results independent of the thread count, and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/interaction.h"
#include "ember/parallel.h"
#include "isa_test_util.h"

namespace ember {
namespace {

// n inputs [batch, dim] of float values that bf16 holds exactly (so both dtypes see the same numbers).
struct Case {
  int64_t n, batch, dim;
  bool bf16;
  std::vector<std::vector<float>> x;
  std::vector<std::vector<uint16_t>> x16;
  std::vector<TensorView> views;

  Case(int64_t n_, int64_t batch_, int64_t dim_, bool bf16_, uint32_t seed)
      : n(n_), batch(batch_), dim(dim_), bf16(bf16_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    x.resize(n);
    x16.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < batch * dim; ++k) {
        const float v = bf16::widen(bf16::round_bits(bf16::float_bits(normal(rng))));
        x[i].push_back(v);
        x16[i].push_back(static_cast<uint16_t>(bf16::float_bits(v) >> 16));
      }
      views.push_back(bf16 ? TensorView(x16[i].data(), DType::bf16, {batch, dim})
                           : TensorView(x[i].data(), DType::f32, {batch, dim}));
    }
  }
  double at(int64_t i, int64_t b, int64_t c) const { return x[i][b * dim + c]; }
};

// A [rows, cols] buffer of the case's dtype.
struct Buffer {
  std::vector<float> f;
  std::vector<uint16_t> h;
  TensorView view;
  Buffer(int64_t rows, int64_t cols, bool bf16) : f(rows * cols, -7.0f), h(rows * cols, 0x7FC0) {
    view = bf16 ? TensorView(h.data(), DType::bf16, {rows, cols}) : TensorView(f.data(), DType::f32, {rows, cols});
  }
  float get(size_t i) const { return h.size() && view.dtype() == DType::bf16 ? bf16::widen(h[i]) : f[i]; }
};

// The definition's grad x_i[k] for one sample: g is the sample's output gradient row, x_at(j) input j at column k.
template <typename X>
double grad_definition(const double* g, int64_t n, int64_t dim, int64_t i, int64_t k, X&& x_at) {
  double sum = i == 0 ? g[k] : 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (j == i) continue;
    const int64_t hi = std::max(i, j), lo = std::min(i, j);
    sum += g[dim + hi * (hi - 1) / 2 + lo] * x_at(j);
  }
  return sum;
}

double tol(bool bf16, double ref) { return (bf16 ? 1.0 / 128 : 2e-5) * (1.0 + std::fabs(ref)); }

TEST(Interaction, ForwardAndBackwardMatchTheDefinitionOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (bool bf16 : {false, true}) {
      for (auto [n, dim] : {std::pair<int64_t, int64_t>{1, 8}, {2, 1}, {5, 13}, {27, 128}, {9, 40}}) {
        Case c(n, 7, dim, bf16, static_cast<uint32_t>(n * 100 + dim));
        const int64_t width = interaction::output_width(n, dim);
        Buffer out(7, width, bf16);
        interaction::forward(c.views, out.view);
        std::vector<double> g(7 * width);
        std::mt19937 rng(3);
        std::normal_distribution<float> normal;
        Buffer grad(7, width, bf16);
        for (int64_t k = 0; k < 7 * width; ++k) {
          const float v = bf16::widen(bf16::round_bits(bf16::float_bits(normal(rng))));
          grad.f[k] = v;
          grad.h[k] = static_cast<uint16_t>(bf16::float_bits(v) >> 16);
          g[k] = v;
        }
        std::vector<Buffer> grads;
        std::vector<TensorView> grad_views;
        for (int64_t i = 0; i < n; ++i) grads.emplace_back(7, dim, bf16);
        for (auto& b : grads) grad_views.push_back(b.view);
        interaction::backward(c.views, grad.view, grad_views);
        for (int64_t b = 0; b < 7; ++b) {
          for (int64_t k = 0; k < dim; ++k) ASSERT_EQ(out.get(b * width + k), c.at(0, b, k));
          int64_t p = dim;
          for (int64_t i = 1; i < n; ++i) {
            for (int64_t j = 0; j < i; ++j, ++p) {
              double z = 0;
              for (int64_t k = 0; k < dim; ++k) z += c.at(i, b, k) * c.at(j, b, k);
              ASSERT_NEAR(out.get(b * width + p), z, tol(bf16, z))
                  << isa_name(isa) << " n " << n << " pair " << i << "," << j;
            }
          }
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t k = 0; k < dim; ++k) {
              const double expect =
                  grad_definition(g.data() + b * width, n, dim, i, k, [&](int64_t j) { return c.at(j, b, k); });
              ASSERT_NEAR(grads[i].get(b * dim + k), expect, tol(bf16, expect))
                  << isa_name(isa) << " n " << n << " grad " << i << " column " << k;
            }
          }
        }
      }
    }
  }
}

// float64 inputs run one double path under every ISA cap, equal to the definition to double rounding: normal
// doubles, so a float32 step anywhere would lose ~29 bits and show.
TEST(Interaction, Float64ComputesInDoubleOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    const int64_t n = 6, batch = 5, dim = 11, width = interaction::output_width(n, dim);
    std::mt19937 rng(21);
    std::normal_distribution<double> normal;
    std::vector<std::vector<double>> x(n, std::vector<double>(batch * dim)), dx(n, std::vector<double>(batch * dim));
    std::vector<double> out(batch * width, -7.0), g(batch * width);
    std::vector<TensorView> views, grad_views;
    for (int64_t i = 0; i < n; ++i) {
      for (double& v : x[i]) v = normal(rng);
      views.push_back(TensorView(x[i].data(), DType::f64, {batch, dim}));
      grad_views.push_back(TensorView(dx[i].data(), DType::f64, {batch, dim}));
    }
    for (double& v : g) v = normal(rng);
    interaction::forward(views, TensorView(out.data(), DType::f64, {batch, width}));
    interaction::backward(views, TensorView(g.data(), DType::f64, {batch, width}), grad_views);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t k = 0; k < dim; ++k) ASSERT_EQ(out[b * width + k], x[0][b * dim + k]);
      for (int64_t i = 1, p = dim; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j, ++p) {
          double z = 0;
          for (int64_t k = 0; k < dim; ++k) z += x[i][b * dim + k] * x[j][b * dim + k];
          ASSERT_NEAR(out[b * width + p], z, 1e-14 * (1.0 + std::fabs(z))) << isa_name(isa);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < dim; ++k) {
          const double expect =
              grad_definition(g.data() + b * width, n, dim, i, k, [&](int64_t j) { return x[j][b * dim + k]; });
          ASSERT_NEAR(dx[i][b * dim + k], expect, 1e-14 * (1.0 + std::fabs(expect))) << isa_name(isa);
        }
      }
    }
  }
}

TEST(Interaction, ResultsDoNotDependOnTheThreadCount) {
  Case c(27, 301, 64, false, 1);
  const int64_t width = interaction::output_width(27, 64);
  Buffer one(301, width, false), three(301, width, false);
  const int saved = num_threads();
  set_num_threads(1);
  interaction::forward(c.views, one.view);
  set_num_threads(3);
  interaction::forward(c.views, three.view);
  set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(one.f.data(), three.f.data(), one.f.size() * sizeof(float)));
}

// Regression (UBSan under the property suite): vectors of width 0 have no data (null pointers); the forward copied
// the dense part with memcpy from null, undefined even for 0 bytes. Every dot is then 0.
TEST(Interaction, ZeroWidthVectorsGiveZeroDotsOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
      const std::vector<TensorView> inputs(3, TensorView(nullptr, dtype, {2, 0}));
      const size_t bytes = dtype == DType::f64 ? 8 : dtype == DType::f32 ? 4 : 2;
      std::vector<unsigned char> out(2 * interaction::output_width(3, 0) * bytes, 0xff);
      interaction::forward(inputs, TensorView(out.data(), dtype, {2, interaction::output_width(3, 0)}));
      for (unsigned char byte : out) ASSERT_EQ(byte, 0) << isa_name(isa) << " " << dtype_name(dtype);
    }
  }
}

TEST(Interaction, BadArgumentsThrowBeforeAnythingIsWritten) {
  Case c(3, 4, 8, false, 2);
  Buffer out(4, interaction::output_width(3, 8), false);
  EXPECT_THROW(interaction::forward({}, out.view), ValueError);
  Buffer wrong(4, 9, false);
  EXPECT_THROW(interaction::forward(c.views, wrong.view), ValueError);
  Case other(1, 4, 7, false, 3);
  EXPECT_THROW(interaction::forward({c.views[0], other.views[0]}, out.view), ValueError);
  Case half(3, 4, 8, true, 4);
  EXPECT_THROW(interaction::forward({c.views[0], half.views[1], c.views[2]}, out.view), TypeError);
  EXPECT_THROW(
      interaction::forward(c.views, TensorView(c.x[1].data(), DType::f32, {4, interaction::output_width(3, 8)})),
      ValueError);  // the output on top of an input
  for (float v : out.f) EXPECT_EQ(v, -7.0f);
}

}  // namespace
}  // namespace ember
