#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ember/bf16.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "ember/isa.h"
#include "isa_test_util.h"

namespace ember {
namespace {

// A squeeze-excitation's product: x [N, C, H, W] channels-last times a [N, C, 1, 1] scale viewed expanded.
constexpr int64_t kN = 2, kC = 19, kH = 5, kW = 7;
const int64_t kSizes[] = {kN, kC, kH, kW};
const int64_t kChannelsLast[] = {kH * kW * kC, 1, kW * kC, kC};
const int64_t kScaleExpanded[] = {kC, 1, 0, 0};

TEST(Multiply, BroadcastScaleIsTorchsProductRoundedOnceOnEveryIsa) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(kN * kC * kH * kW), scale(kN * kC);
  for (auto& v : x) v = normal(rng);
  for (auto& v : scale) v = normal(rng);
  std::vector<uint16_t> xb(x.size()), sb(scale.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16::round_bits(bf16::float_bits(x[i]));
  for (size_t i = 0; i < scale.size(); ++i) sb[i] = bf16::round_bits(bf16::float_bits(scale[i]));
  for (Isa isa : testing::supported_isas()) {
    const testing::ScopedIsaCap cap(isa);
    std::vector<float> out(x.size(), -1.0F);
    std::vector<uint16_t> out_b(x.size(), 0);
    multiply(TensorView(x.data(), DType::f32, kSizes, kChannelsLast, 4),
             TensorView(scale.data(), DType::f32, kSizes, kScaleExpanded, 4),
             TensorView(out.data(), DType::f32, kSizes, kChannelsLast, 4));
    multiply(TensorView(xb.data(), DType::bf16, kSizes, kChannelsLast, 4),
             TensorView(sb.data(), DType::bf16, kSizes, kScaleExpanded, 4),
             TensorView(out_b.data(), DType::bf16, kSizes, kChannelsLast, 4));
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t c = 0; c < kC; ++c) {
        for (int64_t p = 0; p < kH * kW; ++p) {
          const size_t at = static_cast<size_t>(n * kH * kW * kC + p * kC + c), s = static_cast<size_t>(n * kC + c);
          ASSERT_EQ(out[at], x[at] * scale[s]) << isa_name(isa);
          const float exact = bf16::widen(xb[at]) * bf16::widen(sb[s]);  // (exact in float32)
          ASSERT_EQ(out_b[at], bf16::round_bits(bf16::float_bits(exact))) << isa_name(isa);
        }
      }
    }
  }
}

TEST(Multiply, RefusesBadArgumentsWithNothingWritten) {
  std::vector<float> x(12, 2.0F), f(12, 3.0F), out(12, 0.0F);
  std::vector<uint16_t> half(12, 0);
  const TensorView xv(x.data(), DType::f32, {3, 4}), fv(f.data(), DType::f32, {3, 4});
  EXPECT_THROW(multiply(xv, TensorView(half.data(), DType::bf16, {3, 4}), TensorView(out.data(), DType::f32, {3, 4})),
               TypeError);
  EXPECT_THROW(multiply(xv, fv, TensorView(out.data(), DType::f32, {4, 3})), ValueError);
  EXPECT_THROW(multiply(xv, fv, TensorView(x.data(), DType::f32, {3, 4})), ValueError);  // out is x
  const int64_t sizes[] = {3, 4}, gapped[] = {8, 1};
  std::vector<float> wide(24, 0.0F);
  EXPECT_THROW(multiply(xv, fv, TensorView(wide.data(), DType::f32, sizes, gapped, 2)), ValueError);
  std::vector<double> d(12, 1.0);
  EXPECT_THROW(multiply(TensorView(d.data(), DType::f64, {3, 4}), TensorView(d.data(), DType::f64, {3, 4}),
                        TensorView(out.data(), DType::f32, {3, 4})),
               TypeError);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0F; }));
  EXPECT_TRUE(std::all_of(wide.begin(), wide.end(), [](float v) { return v == 0.0F; }));
  multiply(xv, fv, TensorView(out.data(), DType::f32, {3, 4}));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 6.0F; }));
}

}  // namespace
}  // namespace ember
