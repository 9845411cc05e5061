// Row normalisations (LayerNorm, RMSNorm) with the residual add: every ISA path and every dtype combination against
// a double-precision reference of ember/norm.h, the sum kept exactly as torch's add rounds it, in place, broadcast
// residuals, a large offset (the two-pass variance), and argument checks that write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "ember/errors.h"
#include "ember/norm.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using norm::RowNorm;
using testing::Matrix;
using testing::to_bf16_and_back;

// h = x + residual as the kernel must form it: one float32 add, rounded to bfloat16 when both operands are.
double sum_at(const Matrix& x, const Matrix* residual, int64_t r, int64_t c) {
  if (residual == nullptr) return x.at(r, c);
  const float sum = static_cast<float>(x.at(r, c)) + static_cast<float>(residual->at(r, c));
  return x.dtype == DType::bf16 && residual->dtype == DType::bf16 ? to_bf16_and_back(sum) : sum;
}

// The definition in double, from h as the kernel forms it.
std::vector<double> reference(RowNorm kind, const Matrix& x, const Matrix* residual, const Matrix* weight,
                              const Matrix* bias, double eps) {
  std::vector<double> y(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < x.cols; ++c) mean += sum_at(x, residual, r, c);
    mean = kind == RowNorm::layer ? mean / static_cast<double>(x.cols) : 0.0;
    for (int64_t c = 0; c < x.cols; ++c) var += std::pow(sum_at(x, residual, r, c) - mean, 2);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(x.cols) + eps);
    for (int64_t c = 0; c < x.cols; ++c) {
      const double w = weight != nullptr ? weight->at(0, c) : 1.0, b = bias != nullptr ? bias->at(0, c) : 0.0;
      y[r * x.cols + c] = (sum_at(x, residual, r, c) - mean) * rstd * w + b;
    }
  }
  return y;
}

TensorView param_view(Matrix& m) {  // [1, cols] seen as [cols]
  void* data = m.dtype == DType::bf16 ? static_cast<void*>(m.bf16.data()) : static_cast<void*>(m.f32.data());
  return TensorView(data, m.dtype, {m.cols});
}

struct Case {
  RowNorm kind;
  DType x_dtype;
  std::optional<DType> residual_dtype;
  std::optional<DType> param_dtype;
  DType out_dtype;
};

void run_case(const Case& k, int64_t rows, int64_t cols, Isa isa) {
  const double eps = 1e-5;
  Matrix x(rows, cols, k.x_dtype, 1, /*pad=*/3);
  std::optional<Matrix> residual, weight, bias, sum;
  if (k.residual_dtype) residual.emplace(rows, cols, *k.residual_dtype, 2, 1);
  if (k.param_dtype) {
    weight.emplace(1, cols, *k.param_dtype, 3);
    if (k.kind == RowNorm::layer) bias.emplace(1, cols, *k.param_dtype, 4);
  }
  const DType h_dtype =
      k.x_dtype == DType::bf16 && (!residual || residual->dtype == DType::bf16) ? DType::bf16 : DType::f32;
  if (residual) sum.emplace(rows, cols, h_dtype, 5);
  Matrix out(rows, cols, k.out_dtype, 6, 2);
  std::optional<TensorView> rv, wv, bv, sv;
  if (residual) rv = residual->view();
  if (weight) wv = param_view(*weight);
  if (bias) bv = param_view(*bias);
  if (sum) sv = sum->view();
  norm::row_norm(k.kind, x.view(), rv ? &*rv : nullptr, wv ? &*wv : nullptr, bv ? &*bv : nullptr, eps, out.view(),
                 sv ? &*sv : nullptr);
  const std::vector<double> expect =
      reference(k.kind, x, residual ? &*residual : nullptr, weight ? &*weight : nullptr, bias ? &*bias : nullptr, eps);
  const double tol = k.out_dtype == DType::bf16 ? 1.0 / 128 : 2e-5;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double e = expect[r * cols + c];
      ASSERT_NEAR(out.at(r, c), e, tol * (1 + std::fabs(e)))
          << isa_name(isa) << (k.kind == RowNorm::rms ? " rms" : " layer") << " cols " << cols << " at " << r << ","
          << c;
      if (sum) {
        ASSERT_EQ(sum->at(r, c), sum_at(x, &*residual, r, c)) << isa_name(isa) << " sum at " << r << "," << c;
      }
    }
  }
}

TEST(RowNorm, EveryDtypeCombinationMatchesTheDefinitionOnEveryPath) {
  const std::optional<DType> residuals[] = {std::nullopt, DType::f32, DType::bf16};
  const std::optional<DType> params[] = {std::nullopt, DType::f32, DType::bf16};
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (RowNorm kind : {RowNorm::layer, RowNorm::rms}) {
      for (DType x_dtype : {DType::f32, DType::bf16}) {
        for (const auto& residual : residuals) {
          for (const auto& param : params) {
            for (DType out_dtype : {DType::f32, DType::bf16}) {
              // Column counts around both vector widths and their tails, and a row of one.
              for (int64_t cols : {1, 7, 16, 33, 100}) {
                run_case({kind, x_dtype, residual, param, out_dtype}, 5, cols, isa);
              }
            }
          }
        }
      }
    }
  }
}

// Rows far from zero: a one-pass E[h²] - E[h]² in float32 loses the variance entirely at this offset.
TEST(RowNorm, LayerNormOfALargeOffsetKeepsTheVariance) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    Matrix x(3, 257, DType::f32, 7);
    for (float& v : x.f32) v = 1000.0f + v * 0.01f;
    Matrix out(3, 257, DType::f32, 8);
    norm::row_norm(RowNorm::layer, x.view(), nullptr, nullptr, nullptr, 0.0, out.view());
    const std::vector<double> expect = reference(RowNorm::layer, x, nullptr, nullptr, nullptr, 0.0);
    for (int64_t i = 0; i < 3 * 257; ++i) {
      ASSERT_NEAR(out.f32[i], expect[i], 1e-4 * (1 + std::fabs(expect[i]))) << isa_name(isa) << " at " << i;
    }
  }
}

// Outputs written over their inputs: out over x and sum_out over the residual (a pre-norm block's update of its
// residual stream), and out over the residual while x is read.
TEST(RowNorm, InPlaceOverEitherInput) {
  const Matrix x0(4, 40, DType::bf16, 9), r0(4, 40, DType::bf16, 10);
  const std::vector<double> expect = reference(RowNorm::rms, x0, &r0, nullptr, nullptr, 1e-6);
  {
    Matrix x = x0, r = r0;
    const TensorView xv = x.view(), rv = r.view();
    norm::row_norm(RowNorm::rms, xv, &rv, nullptr, nullptr, 1e-6, xv, &rv);
    for (int64_t i = 0; i < 160; ++i) {
      ASSERT_NEAR(x.at(i / 40, i % 40), expect[i], (1 + std::fabs(expect[i])) / 128);
      ASSERT_EQ(r.at(i / 40, i % 40), sum_at(x0, &r0, i / 40, i % 40));
    }
  }
  {
    Matrix x = x0, r = r0;
    const TensorView xv = x.view(), rv = r.view();
    norm::row_norm(RowNorm::rms, xv, &rv, nullptr, nullptr, 1e-6, rv);
    for (int64_t i = 0; i < 160; ++i) ASSERT_NEAR(r.at(i / 40, i % 40), expect[i], (1 + std::fabs(expect[i])) / 128);
    EXPECT_EQ(x.bf16, x0.bf16);
  }
}

// A residual of one row broadcast over every row (stride 0), and 3-D operands read as rows.
TEST(RowNorm, BroadcastResidualAndLeadingDimensions) {
  Matrix x(6, 24, DType::f32, 11), bias_row(1, 24, DType::f32, 12), full(6, 24, DType::f32, 13),
      out(6, 24, DType::f32, 14);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 24; ++c) full.set(r, c, static_cast<float>(bias_row.at(0, c)));
  }
  const TensorView x3(x.f32.data(), DType::f32, {2, 3, 24});
  const int64_t sizes[3] = {2, 3, 24}, strides[3] = {0, 0, 1};
  const TensorView broadcast(bias_row.f32.data(), DType::f32, sizes, strides, 3);
  const TensorView out3(out.f32.data(), DType::f32, {2, 3, 24});
  norm::row_norm(RowNorm::layer, x3, &broadcast, nullptr, nullptr, 1e-5, out3);
  const std::vector<double> expect = reference(RowNorm::layer, x, &full, nullptr, nullptr, 1e-5);
  for (int64_t i = 0; i < 144; ++i) ASSERT_NEAR(out.f32[i], expect[i], 2e-5 * (1 + std::fabs(expect[i])));
}

// The bfloat16 copy of a float32 result is that result rounded, bit for bit, on every path; it needs a float32 out.
TEST(RowNorm, TheBf16CopyIsTheResultRounded) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    Matrix x(5, 37, DType::bf16, 22), r(5, 37, DType::f32, 23), w(1, 37, DType::f32, 24);
    Matrix out(5, 37, DType::f32, 25), low(5, 37, DType::bf16, 26), sum(5, 37, DType::f32, 27);
    const TensorView xv = x.view(), rv = r.view(), wv = param_view(w), ov = out.view(), lv = low.view();
    const TensorView sv = sum.view();
    norm::row_norm(RowNorm::rms, xv, &rv, &wv, nullptr, 1e-6, ov, &sv, &lv);
    for (int64_t i = 0; i < 5 * 37; ++i) {
      ASSERT_EQ(low.at(i / 37, i % 37), to_bf16_and_back(out.f32[i])) << isa_name(isa) << " at " << i;
    }
    const std::vector<double> expect = reference(RowNorm::rms, x, &r, &w, nullptr, 1e-6);
    for (int64_t i = 0; i < 5 * 37; ++i) ASSERT_NEAR(out.f32[i], expect[i], 2e-5 * (1 + std::fabs(expect[i])));
  }
  Matrix x(2, 8, DType::bf16, 28), out(2, 8, DType::bf16, 29), low(2, 8, DType::bf16, 30), out32(2, 8, DType::f32, 31);
  const TensorView xv = x.view(), ov = out.view(), lv = low.view(), o32 = out32.view();
  const std::vector<uint16_t> before = low.bf16;
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, 1e-5, ov, nullptr, &lv), TypeError);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, 1e-5, o32, nullptr, &o32), TypeError);
  EXPECT_EQ(low.bf16, before);
}

TEST(RowNorm, BadArgumentsThrowAndWriteNothing) {
  Matrix x(4, 8, DType::f32, 15), r(4, 8, DType::f32, 16), w(1, 8, DType::f32, 17), out(4, 8, DType::f32, 18);
  Matrix sum_bf16(4, 8, DType::bf16, 19), w7(1, 7, DType::f32, 20), w_bf16(1, 8, DType::bf16, 21);
  const std::vector<float> before = out.f32;
  const TensorView xv = x.view(), rv = r.view(), wv = param_view(w), ov = out.view();
  const TensorView w7v = param_view(w7), wbv = param_view(w_bf16), sbv = sum_bf16.view();
  std::vector<double> f64(32);
  const TensorView x64(f64.data(), DType::f64, {4, 8});
  EXPECT_THROW(norm::row_norm(RowNorm::layer, x64, nullptr, nullptr, nullptr, 1e-5, ov), TypeError);
  EXPECT_THROW(norm::row_norm(RowNorm::rms, xv, nullptr, &wv, &wv, 1e-5, ov), ValueError);  // RMSNorm: no bias
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, &w7v, nullptr, 1e-5, ov), ValueError);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, &wv, &wbv, 1e-5, ov), TypeError);  // mixed param dtypes
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, -1.0, ov), ValueError);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, NAN, ov), ValueError);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, 1e-5, ov, &sbv), ValueError);  // no r
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, &rv, nullptr, nullptr, 1e-5, ov, &sbv), TypeError);       // h is f32
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, &rv, nullptr, nullptr, 1e-5, ov, &ov), ValueError);       // out = sum
  // Features not of stride 1, an output of another shape, an output whose rows overlap, a partial overlap.
  const int64_t sizes[2] = {4, 4}, strided[2] = {8, 2};
  const TensorView x_strided(x.f32.data(), DType::f32, sizes, strided, 2);
  const TensorView out_small(out.f32.data(), DType::f32, {4, 4});
  EXPECT_THROW(norm::row_norm(RowNorm::layer, x_strided, nullptr, nullptr, nullptr, 1e-5, out_small), ValueError);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, 1e-5, out_small), ValueError);
  const int64_t rows_sizes[2] = {4, 8}, rows_strides[2] = {4, 1};
  const TensorView out_overlapping(out.f32.data(), DType::f32, rows_sizes, rows_strides, 2);
  EXPECT_THROW(norm::row_norm(RowNorm::layer, xv, nullptr, nullptr, nullptr, 1e-5, out_overlapping), ValueError);
  const TensorView x_shifted(x.f32.data() + 1, DType::f32, {3, 8});
  const TensorView out_shifted(x.f32.data(), DType::f32, {3, 8});
  EXPECT_THROW(norm::row_norm(RowNorm::layer, x_shifted, nullptr, nullptr, nullptr, 1e-5, out_shifted), ValueError);
  EXPECT_EQ(out.f32, before);
}

}  // namespace
}  // namespace ember
