// Dropout against its scalar definition (ember/dropout.h), bit for bit, on every ISA path, at lengths and
// alignments that hit every tail; Philox against the known answers of its authors; the statistics of the mask;
// and the checked entry point's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dropout/dropout_kernels.h"
#include "ember/bf16.h"
#include "ember/dropout.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "isa_test_util.h"

namespace ember {
namespace {

using bf16::bits_float;
using bf16::float_bits;

constexpr float kPoison = -1234.5f;
constexpr uint16_t kPoisonBits = 0xDEAD;

// Random values with the specials mixed in: a dropped infinity or NaN must give NaN, a dropped -x must give -0.
std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> out(n);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max()};
  for (size_t i = 0; i < n; ++i) out[i] = i % 97 < 7 ? specials[i % 97] : normal(rng);
  return out;
}

// The definition, element by element, in float32.
std::vector<float> reference(const std::vector<float>& x, const dropout::Params& params) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * dropout::element_factor(params, i);
  return y;
}

bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }

// Runs dropout on `values` placed `offset` elements into a buffer (unaligned for the vector paths), into a
// separate output and in place, and checks every element against the definition and the guard after the end.
void check_f32(const std::vector<float>& values, double p, uint64_t seed, int64_t offset) {
  const auto params = dropout::make_params(p, seed);
  const auto expected = reference(values, params);
  const auto n = static_cast<int64_t>(values.size());
  constexpr int64_t kGuard = 64;
  std::vector<float> in(offset + n), out(offset + n + kGuard, kPoison);
  std::copy(values.begin(), values.end(), in.begin() + offset);
  dropout::apply(in.data() + offset, out.data() + offset, n, params);
  dropout::apply(in.data() + offset, in.data() + offset, n, params);  // in place
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_bits(out[offset + i], expected[i]))
        << "element " << i << " of " << n << ", p=" << p << ", offset " << offset << ": x=" << values[i] << " got "
        << out[offset + i] << " expected " << expected[i];
    ASSERT_TRUE(same_bits(in[offset + i], expected[i])) << "in place, element " << i;
  }
  for (int64_t i = 0; i < kGuard; ++i) ASSERT_TRUE(same_bits(out[offset + n + i], kPoison)) << "wrote past the end";
}

// bf16: the input's bf16 rounding, widened, times the factor, rounded to nearest even once.
void check_bf16(const std::vector<float>& values, double p, uint64_t seed, int64_t offset) {
  const auto params = dropout::make_params(p, seed);
  const auto n = static_cast<int64_t>(values.size());
  constexpr int64_t kGuard = 64;
  std::vector<uint16_t> in(offset + n), out(offset + n + kGuard, kPoisonBits);
  for (int64_t i = 0; i < n; ++i) in[offset + i] = bf16::round_bits(float_bits(values[i]));
  dropout::apply_bf16(in.data() + offset, out.data() + offset, n, params);
  for (int64_t i = 0; i < n; ++i) {
    const float x = bits_float(static_cast<uint32_t>(in[offset + i]) << 16);
    const uint16_t expected = bf16::round_bits(float_bits(x * dropout::element_factor(params, i)));
    ASSERT_EQ(out[offset + i], expected) << "element " << i << " of " << n << ", p=" << p;
  }
  for (int64_t i = 0; i < kGuard; ++i) ASSERT_EQ(out[offset + n + i], kPoisonBits) << "wrote past the end";
}

TEST(Philox, KnownAnswersOfRandom123) {
  // Random123's kat_vectors, "philox4x32 10": counter, key, expected words.
  using philox::philox4x32;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, 0, 0), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Dropout, ElementWordFollowsTheTileMapping) {
  const uint64_t seed = 0x0123456789ABCDEFULL;
  for (uint64_t tile : {0ULL, 1ULL, 12345ULL}) {
    for (int w = 0; w < 4; ++w) {
      for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(dropout::element_word(seed, 64 * tile + 16 * w + j), philox::block_words(seed, 16 * tile + j)[w]);
      }
    }
  }
}

TEST(Dropout, ParamsFromProbability) {
  EXPECT_EQ(dropout::make_params(0.0, 1).threshold, 0U);
  EXPECT_EQ(dropout::make_params(0.0, 1).scale, 1.0f);
  EXPECT_EQ(dropout::make_params(0.5, 1).threshold, 0x80000000U);
  EXPECT_EQ(dropout::make_params(0.5, 1).scale, 2.0f);
  EXPECT_EQ(dropout::make_params(0.1, 1).threshold, 429496730U);  // round(0.1 * 2^32)
  EXPECT_EQ(dropout::make_params(0.1, 1).scale, static_cast<float>(1.0 / 0.9));
  EXPECT_EQ(dropout::make_params(1.0, 1).scale, 0.0f);
  EXPECT_EQ(dropout::make_params(std::nextafter(1.0, 0.0), 1).threshold, 0xFFFFFFFFU);
  for (double bad : {-0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(dropout::make_params(bad, 1), ValueError) << bad;
  }
}

class DropoutPerIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(DropoutPerIsa, MatchesTheDefinitionAtEveryLengthAndAlignment) {
  testing::ScopedIsaCap cap(GetParam());
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    for (size_t n : {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 129, 1000, 40009}) {
      for (int64_t offset : {0, 1, 5}) {
        const auto values = random_values(n, static_cast<uint32_t>(n * 31 + offset));
        check_f32(values, p, 0x9E3779B97F4A7C15ULL + n, offset);
        check_bf16(values, p, 42 + n, offset);
      }
    }
  }
}

TEST_P(DropoutPerIsa, BlockCounterCarriesIntoItsHighWord) {
  // Elements near 4 * 2^32 draw blocks whose low counter word wraps inside one vector. The kernels index by
  // absolute element, so shifting the base pointer back puts a small buffer at that index.
  testing::ScopedIsaCap cap(GetParam());
  const auto params = dropout::make_params(0.5, 77);
  const int64_t first = (int64_t{1} << 34) - 128;  // 2 tiles before block 2^32
  const int64_t n = 512;
  const auto values = random_values(n, 5);
  std::vector<float> out(n, kPoison);
  const auto& impl = GetParam() >= Isa::avx512 ? dropout::kernels::apply_avx512<float>
                     : GetParam() >= Isa::avx2 ? dropout::kernels::apply_avx2<float>
                                               : dropout::kernels::apply_ref<float>;
  impl(values.data() - first, out.data() - first, first, first + n, params.seed, params.threshold, params.scale);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_bits(out[i], values[i] * dropout::element_factor(params, first + i))) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllSupported, DropoutPerIsa, ::testing::ValuesIn(testing::supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(Dropout, ReportsTheImplementationItRuns) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    EXPECT_EQ(dropout::implementation(), std::min(isa, Isa::avx512) == Isa::avx512 ? Isa::avx512
                                         : isa >= Isa::avx2                        ? Isa::avx2
                                                                                   : Isa::ref);
  }
}

TEST(Dropout, ResultIndependentOfThreadCount) {
  const auto values = random_values((1 << 20) + 37, 3);
  const auto params = dropout::make_params(0.3, 1234);
  const int saved = num_threads();
  set_num_threads(1);
  std::vector<float> expected(values.size());
  dropout::apply(values.data(), expected.data(), static_cast<int64_t>(values.size()), params);
  for (int threads : {2, 3, 8}) {
    set_num_threads(threads);
    std::vector<float> out(values.size(), kPoison);
    dropout::apply(values.data(), out.data(), static_cast<int64_t>(values.size()), params);
    EXPECT_EQ(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)), 0) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Dropout, KeepRateAndIndependence) {
  // Over 2^22 elements the kept fraction's standard deviation is sqrt(p (1 - p) / n) < 2.5e-4: 6 sigma bounds.
  // Neighbours (in a word, across words of a block, across blocks) are kept together at rate (1 - p)^2, and
  // different seeds agree only by chance.
  const int64_t n = int64_t{1} << 22;
  const std::vector<float> ones(n, 1.0f);
  std::vector<float> out(n), other(n);
  for (double p : {0.1, 0.5, 0.9}) {
    const auto params = dropout::make_params(p, 2024);
    dropout::apply(ones.data(), out.data(), n, params);
    dropout::apply(ones.data(), other.data(), n, dropout::make_params(p, 2025));
    int64_t kept = 0, both = 0, both_seeds = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(out[i] == 0.0f || out[i] == params.scale) << "element " << i << " = " << out[i];
      kept += out[i] != 0.0f;
      if (i + 1 < n) both += out[i] != 0.0f && out[i + 1] != 0.0f;
      both_seeds += out[i] != 0.0f && other[i] != 0.0f;
    }
    const double q = 1.0 - p, sigma = std::sqrt(p * q / static_cast<double>(n));
    EXPECT_NEAR(static_cast<double>(kept) / n, q, 6 * sigma) << "p=" << p;
    const double pair_sigma = std::sqrt(q * q * (1 - q * q) / static_cast<double>(n)) * 2;  // neighbours overlap
    EXPECT_NEAR(static_cast<double>(both) / (n - 1), q * q, 6 * pair_sigma) << "p=" << p;
    EXPECT_NEAR(static_cast<double>(both_seeds) / n, q * q, 6 * pair_sigma) << "p=" << p;
  }
}

TEST(Dropout, CheckedEntryPoint) {
  // Dense views of any order are taken as flat memory: element i of the definition is the i-th in memory.
  const auto values = random_values(2 * 3 * 64, 9);
  std::vector<float> x(values), out(values.size(), kPoison);
  const int64_t sizes[] = {2, 64, 3}, strides[] = {192, 1, 64};  // channels-last-like
  const TensorView xv(x.data(), DType::f32, sizes, strides, 3), ov(out.data(), DType::f32, sizes, strides, 3);
  dropout::apply(xv, ov, 0.25, 11);
  const auto expected = reference(values, dropout::make_params(0.25, 11));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(same_bits(out[i], expected[i])) << i;
  dropout::apply(xv, xv, 0.25, 11);  // in place
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(x[i], expected[i])) << i;
}

TEST(Dropout, CheckedEntryRejectsBadArgumentsAndWritesNothing) {
  std::vector<float> x(256, 1.0f), out(256, kPoison);
  std::vector<double> x64(256, 1.0);
  std::vector<uint16_t> half(256, kPoisonBits);
  const TensorView xv(x.data(), DType::f32, {16, 16}), ov(out.data(), DType::f32, {16, 16});
  const auto untouched = [&] {
    for (float v : out) ASSERT_TRUE(same_bits(v, kPoison));
    for (uint16_t v : half) ASSERT_EQ(v, kPoisonBits);
  };
  EXPECT_THROW(dropout::apply(TensorView(x64.data(), DType::f64, {16, 16}), ov, 0.5, 1), TypeError);
  EXPECT_THROW(dropout::apply(xv, TensorView(half.data(), DType::bf16, {16, 16}), 0.5, 1), TypeError);
  EXPECT_THROW(dropout::apply(xv, TensorView(out.data(), DType::f32, {16, 8}), 0.5, 1), ValueError);
  const int64_t sizes[] = {16, 16}, transposed[] = {1, 16}, half_sizes[] = {8, 16}, gappy[] = {32, 1};
  EXPECT_THROW(dropout::apply(xv, TensorView(out.data(), DType::f32, sizes, transposed, 2), 0.5, 1), ValueError);
  const TensorView gappy_x(x.data(), DType::f32, half_sizes, gappy, 2),
      gappy_out(out.data(), DType::f32, half_sizes, gappy, 2);
  EXPECT_THROW(dropout::apply(gappy_x, gappy_out, 0.5, 1), ValueError);
  // Partial overlap (out one element after x).
  EXPECT_THROW(
      dropout::apply(TensorView(x.data(), DType::f32, {255}), TensorView(x.data() + 1, DType::f32, {255}), 0.5, 1),
      ValueError);
  EXPECT_EQ(x, std::vector<float>(256, 1.0f));
  EXPECT_THROW(dropout::apply(xv, ov, 1.5, 1), ValueError);
  EXPECT_THROW(dropout::apply(xv, ov, std::nan(""), 1), ValueError);
  untouched();
}

}  // namespace
}  // namespace ember
