// max_magnitude (the guard of the GELU a oneDNN primitive fuses) against a plain scan: every dtype, the specials
// at any position, rows with gaps (whose contents must not count), dense views in another order, thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/magnitude.h"
#include "ember/bf16.h"
#include "ember/parallel.h"

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// float16 bits of a value exactly representable in it (the tests' values: small integers, halves, specials).
uint16_t to_half(float v) {
  if (std::isnan(v)) return 0x7E00;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const float a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7C00;
  if (a == 0.0f) return sign;
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  const auto mantissa = static_cast<uint16_t>(std::lround((fraction * 2.0f - 1.0f) * 1024.0f));
  return sign | static_cast<uint16_t>((exponent + 14) << 10) | mantissa;
}

// `values` stored as `dtype` (a buffer of its bits) and viewed as [rows, cols] with `row_stride` elements apart.
struct Stored {
  std::vector<uint32_t> f32;
  std::vector<uint16_t> b16;
  DType dtype;
  Stored(const std::vector<float>& values, DType dtype) : dtype(dtype) {
    for (float v : values) {
      if (dtype == DType::f32) {
        f32.push_back(bf16::float_bits(v));
      } else {
        b16.push_back(dtype == DType::bf16 ? bf16::round_bits(bf16::float_bits(v)) : to_half(v));
      }
    }
  }
  TensorView view(std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    void* data = dtype == DType::f32 ? static_cast<void*>(f32.data()) : static_cast<void*>(b16.data());
    return TensorView(data, dtype, sizes.data(), strides.data(), static_cast<int>(sizes.size()));
  }
};

float plain_max(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t row_stride) {
  float top = 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float v = std::fabs(values[static_cast<size_t>(i * row_stride + j)]);
      if (std::isnan(v) || std::isnan(top)) {
        top = kNaN;
      } else {
        top = std::max(top, v);
      }
    }
  }
  return top;
}

void expect_same(float got, float want) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "got " << got;
  } else {
    EXPECT_EQ(got, want);
  }
}

class MaxMagnitude : public ::testing::TestWithParam<DType> {};

void check_specials_anywhere(DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-64, 64);
  // Shapes around the scan's chunk (32k elements) and a vector's width; the gap after each row holds the largest
  // magnitudes of the buffer, which a view of the rows must not read.
  for (auto [rows, cols, gap] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 0},
                                 {3, 17, 5},
                                 {64, 384, 0},
                                 {200, 384, 128},
                                 {1500, 384, 0},
                                 {33, 1024, 1}}) {
    const int64_t stride = cols + gap;
    for (float special : {0.0f, -1000.0f, kInf, -kInf, kNaN}) {
      std::vector<float> values(static_cast<size_t>(rows * stride));
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < stride; ++j) {
          values[static_cast<size_t>(i * stride + j)] = j < cols ? 0.5f * static_cast<float>(small(rng)) : kNaN;
        }
      }
      if (special != 0.0f) {
        const int64_t i = std::uniform_int_distribution<int64_t>(0, rows - 1)(rng);
        const int64_t j = std::uniform_int_distribution<int64_t>(0, cols - 1)(rng);
        values[static_cast<size_t>(i * stride + j)] = special;
      }
      Stored stored(values, dtype);
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        expect_same(max_magnitude(stored.view({rows, cols}, {stride, 1})), plain_max(values, rows, cols, stride));
      }
      set_num_threads(1);
    }
  }
}

TEST_P(MaxMagnitude, MatchesAPlainScanWithSpecialsAnywhere) { check_specials_anywhere(GetParam(), 7); }

TEST_P(MaxMagnitude, ReadsADenseViewInAnyOrder) {
  const DType dtype = GetParam();
  std::vector<float> values(size_t{2} * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7) - 3.0f;
  values[13] = -9.0f;
  Stored stored(values, dtype);
  // [2, 4, 3] read channels-last: strides {12, 1, 4} cover the buffer once.
  EXPECT_EQ(max_magnitude(stored.view({2, 4, 3}, {12, 1, 4})), 9.0f);
}

TEST_P(MaxMagnitude, AnEmptyViewIsZeroAndAnUnreadableOneIsNaN) {
  const DType dtype = GetParam();
  Stored stored(std::vector<float>(16, 1.0f), dtype);
  EXPECT_EQ(max_magnitude(stored.view({0, 4}, {4, 1})), 0.0f);
  // Columns two apart: neither dense nor rows of unit stride.
  EXPECT_TRUE(std::isnan(max_magnitude(stored.view({2, 4}, {8, 2}))));
}

TEST_P(MaxMagnitude, TheMagnitudeSumAddsEveryElementOnce) {
  const DType dtype = GetParam();
  if (dtype == DType::f16) GTEST_SKIP() << "magnitude_sum reads float32 and bfloat16 (the packed weights' dtypes)";
  // 100000 elements of +-0.5, +-1.5, ... (exact in bf16 and in float sums of a few thousand): past the chunk size.
  const int64_t n = 100000;
  std::vector<float> values(static_cast<size_t>(n));
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = (static_cast<float>(i % 7) + 0.5f) * (i % 2 == 0 ? 1.0f : -1.0f);
    values[static_cast<size_t>(i)] = v;
    want += std::fabs(v);
  }
  const float kept[2] = {values[123], values[77777]};
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    Stored stored(values, dtype);
    EXPECT_EQ(magnitude_sum(stored.view({n}, {1})), want);
    values[123] = kInf;
    EXPECT_EQ(magnitude_sum(Stored(values, dtype).view({n}, {1})), kInf);
    values[77777] = kNaN;
    EXPECT_TRUE(std::isnan(magnitude_sum(Stored(values, dtype).view({n}, {1}))));
    values[123] = kept[0];
    values[77777] = kept[1];
  }
  set_num_threads(1);
  Stored stored(values, dtype);
  EXPECT_TRUE(std::isnan(magnitude_sum(stored.view({n / 2}, {2}))));  // not dense
  EXPECT_EQ(magnitude_sum(stored.view({0}, {1})), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MaxMagnitude, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(MaxMagnitudeOther, AnotherDtypeIsNaN) {
  std::vector<int32_t> values(8, 1);
  EXPECT_TRUE(std::isnan(max_magnitude(TensorView(values.data(), DType::i32, {8}))));
}

}  // namespace
}  // namespace ember
