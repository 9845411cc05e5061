// Every bf16 path against the scalar definitions of ember/bf16.h, bit for bit, on special values, on every
// 16-bit top half with a spread of bottom halves, on random patterns, at lengths that hit every vector tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/streaming.h"
#include "isa_test_util.h"

namespace ember {
namespace {

using bf16::bits_float;
using bf16::float_bits;

constexpr uint16_t kPoison = 0xDEAD;

// Special patterns: zeros, denormals, normals at the edges, infinities, quiet and signalling NaNs with payloads
// in the top and in the bottom half, both signs.
std::vector<uint32_t> special_patterns() {
  std::vector<uint32_t> out;
  const uint32_t magnitudes[] = {0x00000000, 0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x0000FFFF,
                                 0x00010000, 0x007FFFFF, 0x00800000, 0x00808000, 0x00818000, 0x3F800000,
                                 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7F7FFF, 0x7F7F8000,
                                 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7F807FFF, 0x7F808000, 0x7F80FFFF,
                                 0x7FC00000, 0x7FFF0000, 0x7FFF8000, 0x7FFFFFFF, 0x7FA00001, 0x7FBFFFFF};
  for (uint32_t m : magnitudes) {
    out.push_back(m);
    out.push_back(m | 0x80000000U);
  }
  return out;
}

// All 65536 top halves, each with a spread of bottoms: 0, 1, the two neighbours of the tie, the tie, all ones.
std::vector<uint32_t> all_tops_patterns() {
  std::vector<uint32_t> out;
  const uint32_t bottoms[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC001};
  for (uint32_t top = 0; top <= 0xFFFF; ++top) {
    for (uint32_t b : bottoms) out.push_back((top << 16) | b);
  }
  return out;
}

std::vector<uint32_t> random_patterns(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> out(n);
  for (auto& v : out) v = rng();
  return out;
}

std::vector<float> as_floats(const std::vector<uint32_t>& bits) {
  std::vector<float> out(bits.size());
  if (!bits.empty()) std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

// Runs split, join and round over `bits`, with inputs and outputs starting `offset` elements into their buffers
// (so that the aligned-store paths must peel a head), streaming on or off, and checks every element.
void check_all_ops(const std::vector<uint32_t>& bits, const char* what, int64_t offset = 0, bool stream = false) {
  const int64_t saved_threshold = stream_threshold_bytes();
  set_stream_threshold_bytes(stream ? 0 : INT64_MAX);
  const std::vector<float> src_buf = as_floats(std::vector<uint32_t>(offset, 0x3F800000U));
  std::vector<float> src_storage(src_buf);
  const std::vector<float> values = as_floats(bits);
  src_storage.insert(src_storage.end(), values.begin(), values.end());
  const float* src = src_storage.data() + offset;
  const int64_t n = static_cast<int64_t>(bits.size());
  // Guard elements after the outputs: vector stores must not write past the end (ASan does not see intrinsics).
  constexpr int64_t kGuard = 64;
  std::vector<uint16_t> top_buf(n + offset + kGuard, kPoison), bottom_buf(n + offset + kGuard, kPoison),
      rounded_buf(n + offset + kGuard, kPoison);
  std::vector<float> joined_buf(n + offset + kGuard, bits_float(0x7FBADBAD));
  uint16_t* top = top_buf.data() + offset;
  uint16_t* bottom = bottom_buf.data() + offset;
  uint16_t* rounded = rounded_buf.data() + offset;
  float* joined = joined_buf.data() + offset;
  bf16::split(src, top, bottom, n);
  bf16::join(top, bottom, joined, n);
  bf16::round(src, rounded, n);
  set_stream_threshold_bytes(saved_threshold);
  for (int64_t i = 0; i < offset + n + kGuard; ++i) {
    if (i >= offset && i < offset + n) continue;
    ASSERT_EQ(top_buf[i], kPoison) << what << ": wrote outside the output at " << i - offset;
    ASSERT_EQ(bottom_buf[i], kPoison) << what << ": wrote outside the output at " << i - offset;
    ASSERT_EQ(rounded_buf[i], kPoison) << what << ": wrote outside the output at " << i - offset;
    ASSERT_EQ(float_bits(joined_buf[i]), 0x7FBADBADU) << what << ": wrote outside the output at " << i - offset;
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(top[i], bf16::split_top(bits[i])) << what << " split top, pattern 0x" << std::hex << bits[i];
    ASSERT_EQ(bottom[i], bf16::split_bottom(bits[i])) << what << " split bottom, 0x" << std::hex << bits[i];
    ASSERT_EQ(float_bits(joined[i]), bits[i]) << what << " join(split(x)) != x for 0x" << std::hex << bits[i];
    ASSERT_EQ(rounded[i], bf16::round_bits(bits[i])) << what << " round, 0x" << std::hex << bits[i];
  }
}

class Bf16PerIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(Bf16PerIsa, SpecialValues) {
  testing::ScopedIsaCap cap(GetParam());
  check_all_ops(special_patterns(), "special");
}

TEST_P(Bf16PerIsa, EveryTopHalf) {
  testing::ScopedIsaCap cap(GetParam());
  check_all_ops(all_tops_patterns(), "all tops");
}

TEST_P(Bf16PerIsa, RandomPatternsAndTails) {
  testing::ScopedIsaCap cap(GetParam());
  for (size_t n : {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 100003}) {
    check_all_ops(random_patterns(n, static_cast<uint32_t>(n) + 1), "random");
  }
}

TEST_P(Bf16PerIsa, StreamingStoresAtEveryAlignment) {
  testing::ScopedIsaCap cap(GetParam());
  for (int64_t offset : {0, 1, 2, 3, 7, 8, 15, 16, 17, 31}) {
    for (size_t n : {0, 1, 5, 16, 33, 100, 4099}) {
      check_all_ops(random_patterns(n, static_cast<uint32_t>(n * 131 + offset)), "streamed", offset, true);
      check_all_ops(random_patterns(n, static_cast<uint32_t>(n * 7 + offset)), "offset", offset, false);
    }
  }
  check_all_ops(all_tops_patterns(), "all tops, streamed", 3, true);
}

TEST_P(Bf16PerIsa, ReportsTheImplementationItRuns) {
  testing::ScopedIsaCap cap(GetParam());
  for (bf16::Op op : {bf16::Op::split, bf16::Op::join, bf16::Op::round}) {
    EXPECT_LE(static_cast<int>(bf16::implementation(op)), static_cast<int>(GetParam()));
  }
  if (GetParam() >= Isa::avx2) {
    EXPECT_EQ(bf16::implementation(bf16::Op::split), std::min(GetParam(), Isa::avx512));
  }
  if (GetParam() >= Isa::avx512_bf16) {
    EXPECT_EQ(bf16::implementation(bf16::Op::round), Isa::avx512_bf16);
  }
}

INSTANTIATE_TEST_SUITE_P(AllSupported, Bf16PerIsa, ::testing::ValuesIn(testing::supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(Bf16, RoundMatchesSpecOnKnownValues) {
  EXPECT_EQ(bf16::round_bits(float_bits(1.0f)), 0x3F80);
  EXPECT_EQ(bf16::round_bits(0x3F808000), 0x3F80);  // tie, even stays
  EXPECT_EQ(bf16::round_bits(0x3F818000), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(bf16::round_bits(0x3F808001), 0x3F81);
  EXPECT_EQ(bf16::round_bits(0x7F7FFFFF), 0x7F80);  // largest float rounds to infinity, as in IEEE RNE
  EXPECT_EQ(bf16::round_bits(0x7F800001), 0x7FC0);  // signalling NaN with low payload: quiet NaN
  EXPECT_EQ(bf16::round_bits(0xFFFFFFFF), 0xFFFF);  // NaN keeps its sign and payload
  EXPECT_EQ(bf16::round_bits(0x00008000), 0x0000);  // denormal tie rounds to even (zero)
  EXPECT_EQ(bf16::round_bits(0x00018000), 0x0002);
}

TEST(Bf16, ResultIndependentOfThreadCount) {
  const auto bits = random_patterns((1 << 20) + 37, 7);
  const auto src = as_floats(bits);
  const int saved = num_threads();
  std::vector<uint16_t> reference(src.size());
  set_num_threads(1);
  bf16::round(src.data(), reference.data(), static_cast<int64_t>(src.size()));
  for (int threads : {2, 3, 8}) {
    set_num_threads(threads);
    std::vector<uint16_t> out(src.size(), kPoison);
    bf16::round(src.data(), out.data(), static_cast<int64_t>(src.size()));
    EXPECT_EQ(out, reference) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Streaming, ThresholdSetting) {
  const int64_t saved = stream_threshold_bytes();
  EXPECT_GT(last_level_cache_bytes(), 0);
  set_stream_threshold_bytes(100);
  EXPECT_TRUE(should_stream(101));
  EXPECT_FALSE(should_stream(100));
  EXPECT_THROW(set_stream_threshold_bytes(-1), ValueError);
  set_stream_threshold_bytes(saved);
}

TEST(Bf16, RoundTakesAnyDenseLayoutTheSameForBoth) {
  // A channels-last [1, 3, 2, 2] activation: strides (12, 1, 6, 3), its elements one run in memory.
  std::vector<float> src(12);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 1.0f + static_cast<float>(i) / 3.0f;
  std::vector<uint16_t> out(12, kPoison);
  const int64_t sizes[] = {1, 3, 2, 2}, channels_last[] = {12, 1, 6, 3}, contiguous[] = {12, 4, 2, 1};
  bf16::round(TensorView(src.data(), DType::f32, sizes, channels_last, 4),
              TensorView(out.data(), DType::bf16, sizes, channels_last, 4));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(out[i], bf16::round_bits(float_bits(src[i])));
  // Another layout for out, or an x with gaps, is refused before anything is written.
  std::vector<uint16_t> untouched(12, kPoison);
  EXPECT_THROW(bf16::round(TensorView(src.data(), DType::f32, sizes, channels_last, 4),
                           TensorView(untouched.data(), DType::bf16, sizes, contiguous, 4)),
               ValueError);
  const int64_t half[] = {2}, every_other[] = {2};
  EXPECT_THROW(bf16::round(TensorView(src.data(), DType::f32, half, every_other, 1),
                           TensorView(untouched.data(), DType::bf16, {2})),
               ValueError);
  for (uint16_t v : untouched) EXPECT_EQ(v, kPoison);
  // No elements: any strides, for either (a transposed [0, 2] made contiguous keeps its own).
  const int64_t empty[] = {0, 2}, transposed[] = {1, 1}, rows[] = {2, 1};
  EXPECT_NO_THROW(bf16::round(TensorView(src.data(), DType::f32, empty, transposed, 2),
                              TensorView(untouched.data(), DType::bf16, empty, rows, 2)));
}

TEST(Bf16, CheckedEntryRejectsBadArgumentsAndWritesNothing) {
  std::vector<float> src(8, 1.5f);
  std::vector<uint16_t> top(8, kPoison), bottom(8, kPoison);
  TensorView s(src.data(), DType::f32, {8});
  TensorView t(top.data(), DType::bf16, {8});
  TensorView b(bottom.data(), DType::i16, {8});
  EXPECT_THROW(bf16::split(s, TensorView(top.data(), DType::f16, {8}), b), TypeError);
  EXPECT_THROW(bf16::split(s, TensorView(top.data(), DType::bf16, {4}), b), ValueError);
  EXPECT_THROW(bf16::split(s, t, t.dtype() == DType::bf16 ? TensorView(top.data(), DType::i16, {8}) : b), ValueError);
  const int64_t size[] = {4};
  const int64_t stride2[] = {2};
  EXPECT_THROW(bf16::split(TensorView(src.data(), DType::f32, size, stride2, 1),
                           TensorView(top.data(), DType::bf16, {4}), TensorView(bottom.data(), DType::i16, {4})),
               ValueError);
  // An output inside the input's bytes.
  EXPECT_THROW(bf16::round(s, TensorView(src.data(), DType::bf16, {8})), ValueError);
  EXPECT_THROW(bf16::join(t, b, TensorView(top.data(), DType::f32, {8})), ValueError);
  for (uint16_t v : top) EXPECT_EQ(v, kPoison);
  for (uint16_t v : bottom) EXPECT_EQ(v, kPoison);
  EXPECT_NO_THROW(bf16::split(s, t, b));
  EXPECT_EQ(top[0], 0x3FC0);
}

}  // namespace
}  // namespace ember
