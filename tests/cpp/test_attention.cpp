// Scaled dot-product attention: every ISA path, float32 and bfloat16, against a double-precision reference of
// ember/attention.h over odd lengths and feature sizes, transposed ([B, L, H, E]) layouts, grouped-query heads,
// float, bfloat16 and boolean masks with broadcasting, the causal triangle; fully masked rows, NaN confined to its
// row, results independent of the thread count, and argument checks that write nothing; the few-query path (chunks of
// keys merged) on the same definition.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "ember/attention.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "heads_tensor.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::Heads;
using testing::Matrix;

// A mask of `sizes` (aligned right against [B, H, Lq, Lk]), row-major; values: a float bias, or keep-flags.
struct Mask {
  std::vector<int64_t> sizes;
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> keep;
  Mask(std::vector<int64_t> s, DType dt, uint32_t seed) : sizes(std::move(s)), dtype(dt) {
    int64_t n = 1;
    for (int64_t v : sizes) n *= v;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> bias(-3.0f, 1.0f);
    std::bernoulli_distribution kept(0.7);
    for (int64_t i = 0; i < n; ++i) {
      const float value = kept(rng) ? testing::to_bf16_and_back(bias(rng)) : -std::numeric_limits<float>::infinity();
      f32.push_back(value);
      bf16.push_back(static_cast<uint16_t>(bf16::float_bits(value) >> 16));
      keep.push_back(value > -1.0f ? 1 : 0);
    }
  }
  // The value added to score (b, h, i, j).
  double at(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    const int64_t full[4] = {bi, hi, i, j};
    int64_t flat = 0;
    const size_t skip = 4 - sizes.size();
    for (size_t d = 0; d < sizes.size(); ++d) flat = flat * sizes[d] + (sizes[d] == 1 ? 0 : full[skip + d]);
    if (dtype == DType::boolean) return keep[flat] != 0 ? 0.0 : -INFINITY;
    return f32[flat];
  }
  TensorView view() {
    std::vector<int64_t> strides(sizes.size());
    int64_t s = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      strides[d] = s;
      s *= sizes[d];
    }
    void* data = dtype == DType::boolean ? static_cast<void*>(keep.data())
                 : dtype == DType::bf16  ? static_cast<void*>(bf16.data())
                                         : static_cast<void*>(f32.data());
    return TensorView(data, dtype, sizes.data(), strides.data(), static_cast<int>(sizes.size()));
  }
};

// The definition in double: softmax over the unmasked keys, zeros for a row with none.
std::vector<double> reference(const Heads& q, const Heads& k, const Heads& v, const Mask* mask, bool causal,
                              double scale, double softcap = 0.0) {
  std::vector<double> out(static_cast<size_t>(q.b * q.h * q.l * v.d));
  const int64_t group = q.h / k.h;
  for (int64_t b = 0; b < q.b; ++b) {
    for (int64_t h = 0; h < q.h; ++h) {
      for (int64_t i = 0; i < q.l; ++i) {
        std::vector<double> s(static_cast<size_t>(k.l));
        double top = -INFINITY;
        for (int64_t j = 0; j < k.l; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < q.d; ++e) dot += q.at(b, h, i, e) * k.at(b, h / group, j, e);
          s[j] = dot * scale;
          if (softcap > 0) s[j] = softcap * std::tanh(s[j] / softcap);
          s[j] += mask != nullptr ? mask->at(b, h, i, j) : 0.0;
          if (causal && j > i) s[j] = -INFINITY;
          top = std::max(top, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += x = std::isinf(top) ? 0.0 : std::exp(x - top);
        for (int64_t c = 0; c < v.d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < k.l; ++j) acc += s[j] * v.at(b, h / group, j, c);
          out[((b * q.h + h) * q.l + i) * v.d + c] = sum > 0 ? acc / sum : 0.0;
        }
      }
    }
  }
  return out;
}

struct Case {
  int64_t batch, heads_q, heads_kv, len_q, len_k, dim, dim_v;
  bool causal;
  std::optional<std::vector<int64_t>> mask_sizes;
  DType mask_dtype;
  double softcap = 0.0;
};

void run_case(const Case& c, DType dtype, bool sequence_major, Isa isa) {
  Heads q(c.batch, c.heads_q, c.len_q, c.dim, dtype, 1, sequence_major);
  Heads k(c.batch, c.heads_kv, c.len_k, c.dim, dtype, 2, sequence_major);
  Heads v(c.batch, c.heads_kv, c.len_k, c.dim_v, dtype, 3, sequence_major);
  Heads out(c.batch, c.heads_q, c.len_q, c.dim_v, dtype, 4, sequence_major);
  std::optional<Mask> mask;
  std::optional<TensorView> mask_view;
  if (c.mask_sizes) {
    mask.emplace(*c.mask_sizes, c.mask_dtype, 5);
    mask_view = mask->view();
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
  attention::scaled_dot_product(q.view(), k.view(), v.view(), mask_view ? &*mask_view : nullptr, c.causal, scale,
                                out.view(), c.softcap);
  const std::vector<double> expect = reference(q, k, v, mask ? &*mask : nullptr, c.causal, scale, c.softcap);
  // float32: the exp approximation (3 ulp) and sums over a few hundred keys. bfloat16: one rounding on output, and
  // on the AMX path the probabilities rounded to bf16 for the tile multiply (as torch's kernels round them), an
  // error of 2^-9 of each term: up to about 2^-9 of the values' scale (1 here) where the terms cancel.
  const double relative = dtype == DType::bf16 ? 1.0 / 256 : 2e-6;
  const double absolute = dtype == DType::bf16 ? 1.0 / 128 : 2e-6;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.len_q; ++i) {
        for (int64_t e = 0; e < c.dim_v; ++e) {
          const double want = expect[((b * c.heads_q + h) * c.len_q + i) * c.dim_v + e];
          ASSERT_NEAR(out.at(b, h, i, e), want, relative * std::abs(want) + absolute)
              << "isa " << isa_name(isa) << " " << dtype_name(dtype) << " at (" << b << ", " << h << ", " << i << ", "
              << e << ") lengths " << c.len_q << "x" << c.len_k << " dims " << c.dim << "/" << c.dim_v
              << (c.causal ? " causal" : "") << (c.mask_sizes ? " masked" : "") << " softcap " << c.softcap;
        }
      }
    }
  }
}

TEST(Attention, MatchesTheDefinitionOnEveryPath) {
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 1, 1, 1, false, std::nullopt, DType::f32},
      {2, 3, 3, 7, 5, 13, 13, false, std::nullopt, DType::f32},
      {1, 2, 2, 65, 130, 64, 64, true, std::nullopt, DType::f32},  // blocks of keys and queries with tails
      {1, 4, 2, 33, 33, 16, 24, false, std::nullopt, DType::f32},  // grouped-query, Ev != E
      {1, 8, 1, 20, 71, 32, 32, true, std::nullopt, DType::f32},   // multi-query, causal with Lq < Lk
      {2, 2, 2, 17, 9, 8, 8, false, std::vector<int64_t>{2, 1, 1, 9}, DType::f32},        // a padding mask
      {2, 2, 2, 17, 9, 8, 8, false, std::vector<int64_t>{17, 9}, DType::bf16},            // one mask for all heads
      {2, 2, 1, 70, 66, 8, 5, true, std::vector<int64_t>{2, 2, 70, 66}, DType::boolean},  // full, with causal
      {1, 3, 3, 9, 9, 80, 80, false, std::vector<int64_t>{1, 3, 1, 9}, DType::boolean},
      {2, 2, 2, 17, 9, 8, 8, false, std::vector<int64_t>{2, 1, 17, 9}, DType::f32},  // a float bias per query and key
      {2, 2, 2, 17, 9, 8, 8, true, std::vector<int64_t>{2, 1, 17, 1}, DType::f32},   // per query, every key alike
      {1, 4, 2, 100, 200, 128, 128, true, std::nullopt, DType::f32},  // a Llama head: 4 tiles of features
      {2, 2, 2, 40, 97, 64, 64, false, std::vector<int64_t>{2, 1, 1, 97}, DType::f32},
      // Past one AMX block of 256 keys, with a tail that ends inside a 64-key group and one that fills its group
      {1, 2, 2, 300, 300, 64, 64, true, std::nullopt, DType::f32},
      {1, 2, 1, 45, 520, 32, 48, false, std::vector<int64_t>{1, 1, 45, 520}, DType::bf16},
      {1, 1, 1, 3, 320, 16, 16, false, std::nullopt, DType::f32},
      // Masks of one value per query and key in whole vector blocks (transposed in registers) and their tails: a
      // float bias per batch, and one per head shared by the batch (T5's position bias, Swin's windows)
      {2, 2, 2, 40, 50, 32, 32, false, std::vector<int64_t>{2, 1, 40, 50}, DType::f32},
      {2, 3, 3, 49, 49, 32, 32, true, std::vector<int64_t>{1, 3, 49, 49}, DType::f32},
      // The few-query path (at most 4 queries a head): chunks of 256 keys with a tail, a head group's rows in tiles
      // of four, features that do not fill a vector, every mask kind, the causal bound with Lq < Lk
      {2, 8, 2, 1, 1500, 64, 64, false, std::nullopt, DType::f32},  // a decoded token, grouped heads, 6 chunks
      {1, 6, 6, 4, 600, 64, 64, false, std::nullopt, DType::f32},   // Whisper's cross-attention, shorter
      {1, 4, 1, 3, 513, 13, 24, true, std::nullopt, DType::f32},    // multi-query: 12 rows a group
      {2, 4, 2, 2, 300, 80, 80, false, std::vector<int64_t>{2, 1, 2, 300}, DType::f32},
      {1, 2, 2, 4, 260, 16, 16, false, std::vector<int64_t>{1, 2, 4, 260}, DType::boolean},
      {2, 3, 3, 1, 257, 128, 128, false, std::vector<int64_t>{2, 1, 1, 257}, DType::bf16},
      {1, 2, 2, 4, 4, 64, 64, true, std::nullopt, DType::f32},  // a decoder's self-attention over its prompt
  };
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    ASSERT_EQ(attention::implementation(), isa >= Isa::amx ? Isa::amx : std::min(isa, Isa::avx512_bf16));
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool sequence_major : {false, true}) {
        for (const Case& c : cases) run_case(c, dtype, sequence_major, isa);
      }
    }
  }
}

// Gemma 2's soft cap, softcap · tanh(score / softcap) before the mask, on every path: the general one (vector,
// bf16 pairs, AMX tiles with and without a mask and the causal bound), the few-query one, a block past 256 keys.
TEST(Attention, SoftCappedScoresMatchTheDefinitionOnEveryPath) {
  const std::vector<Case> cases = {
      {1, 4, 2, 40, 70, 64, 64, true, std::nullopt, DType::f32, 0.5},
      {2, 2, 2, 33, 300, 32, 32, false, std::vector<int64_t>{2, 1, 1, 300}, DType::boolean, 0.8},
      {1, 2, 1, 20, 20, 16, 16, false, std::vector<int64_t>{1, 2, 20, 20}, DType::f32, 1.0},
      {2, 8, 2, 1, 600, 64, 64, false, std::nullopt, DType::f32, 0.3},  // few-query: a decoded token
      {1, 4, 4, 3, 40, 48, 48, true, std::vector<int64_t>{1, 1, 3, 40}, DType::bf16, 0.7},
  };
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const Case& c : cases) run_case(c, dtype, false, isa);
    }
  }
  Heads q(1, 1, 2, 8, DType::f32, 1), k(1, 1, 3, 8, DType::f32, 2), out(1, 1, 2, 8, DType::f32, 3);
  for (double bad : {-1.0, static_cast<double>(INFINITY), 1e39}) {
    EXPECT_THROW(attention::scaled_dot_product(q.view(), k.view(), k.view(), nullptr, false, 1.0, out.view(), bad),
                 ValueError);
  }
}

// Every score far below zero (-200) and a tail of keys that does not fill a register tile: the softmax's maximum
// must be over the keys alone (a padded key's score of 0 taken for the maximum would underflow every exponent to 0
// and give zeros); equal scores average the values.
TEST(Attention, ScoresFarBelowZeroStillAverageTheValues) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (int64_t keys : {5, 70}) {
        Heads q(1, 2, 9, 16, dtype, 1), k(1, 2, keys, 16, dtype, 2), v(1, 2, keys, 8, dtype, 3);
        Heads out(1, 2, 9, 8, dtype, 4);
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t e = 0; e < 16; ++e) {
            for (int64_t i = 0; i < 9; ++i) q.storage.set(0, q.offset(0, h, i, e), -5.0);
            for (int64_t j = 0; j < keys; ++j) k.storage.set(0, k.offset(0, h, j, e), 1.0);
          }
        }
        attention::scaled_dot_product(q.view(), k.view(), v.view(), nullptr, false, 2.5, out.view());
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t e = 0; e < 8; ++e) {
            double mean = 0.0;
            for (int64_t j = 0; j < keys; ++j) mean += v.at(0, h, j, e) / static_cast<double>(keys);
            for (int64_t i = 0; i < 9; ++i) {
              ASSERT_NEAR(out.at(0, h, i, e), mean, dtype == DType::bf16 ? 1.0 / 64 : 1e-5)
                  << "isa " << isa_name(isa) << " " << dtype_name(dtype) << " keys " << keys;
            }
          }
        }
      }
    }
  }
}

TEST(Attention, AFullyMaskedRowIsZeroAndTheOthersAreUntouched) {
  Heads q(1, 1, 3, 8, DType::f32, 1), k(1, 1, 4, 8, DType::f32, 2), v(1, 1, 4, 8, DType::f32, 3);
  Heads out(1, 1, 3, 8, DType::f32, 4);
  Mask mask({3, 4}, DType::boolean, 5);
  for (int64_t j = 0; j < 4; ++j) mask.keep[4 + j] = 0;  // row 1: no key kept
  for (int64_t j = 0; j < 4; ++j) mask.keep[j] = 1;
  const TensorView mv = mask.view();
  attention::scaled_dot_product(q.view(), k.view(), v.view(), &mv, false, 0.5, out.view());
  const std::vector<double> expect = reference(q, k, v, &mask, false, 0.5);
  for (int64_t e = 0; e < 8; ++e) {
    EXPECT_EQ(out.at(0, 0, 1, e), 0.0);
    EXPECT_NEAR(out.at(0, 0, 0, e), expect[e], 1e-5);
  }
}

TEST(Attention, NanStaysInItsRow) {
  // bf16 runs the AMX kernel where the machine has it (its own exponent for the probabilities), fp32 the vector one.
  for (DType dtype : {DType::f32, DType::bf16}) {
    Heads q(1, 2, 40, 32, dtype, 1), k(1, 2, 40, 32, dtype, 2), v(1, 2, 40, 32, dtype, 3);
    Heads out(1, 2, 40, 32, dtype, 4);
    q.storage.set(0, q.offset(0, 1, 5, 3), NAN);
    attention::scaled_dot_product(q.view(), k.view(), v.view(), nullptr, false, 0.25, out.view());
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 40; ++i) {
        EXPECT_EQ(std::isnan(out.at(0, h, i, 0)), h == 1 && i == 5) << dtype_name(dtype) << " " << h << ", " << i;
      }
    }
  }
}

// The few-query path merges its chunks of keys: a NaN in one query's row reaches that row alone, and a row whose
// every key is masked in one chunk but not in the others takes the others' keys alone.
TEST(Attention, FewQueriesKeepNanInItsRowAndMergeChunks) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      Heads q(1, 2, 3, 32, dtype, 1), k(1, 2, 600, 32, dtype, 2), v(1, 2, 600, 32, dtype, 3);
      Heads out(1, 2, 3, 32, dtype, 4);
      q.storage.set(0, q.offset(0, 1, 2, 7), NAN);
      Mask mask({3, 600}, DType::boolean, 5);
      for (int64_t j = 0; j < 600; ++j) mask.keep[600 + j] = j >= 256 ? 1 : 0;  // row 1: the first chunk masked
      const TensorView mv = mask.view();
      attention::scaled_dot_product(q.view(), k.view(), v.view(), &mv, false, 0.25, out.view());
      q.storage.set(0, q.offset(0, 1, 2, 7), 0.0);
      const std::vector<double> expect = reference(q, k, v, &mask, false, 0.25);
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 3; ++i) {
          for (int64_t e = 0; e < 32; ++e) {
            const double got = out.at(0, h, i, e);
            if (h == 1 && i == 2) {
              ASSERT_TRUE(std::isnan(got)) << isa_name(isa) << " " << dtype_name(dtype) << " " << e;
            } else {
              const double want = expect[(h * 3 + i) * 32 + e];
              ASSERT_NEAR(got, want, (dtype == DType::bf16 ? 1.0 / 256 : 2e-6) * (std::abs(want) + 2))
                  << isa_name(isa) << " " << dtype_name(dtype) << " (" << h << ", " << i << ", " << e << ")";
            }
          }
        }
      }
    }
  }
}

TEST(Attention, ResultsDoNotDependOnTheThreadCount) {
  const int saved = num_threads();
  Heads q(2, 3, 150, 32, DType::bf16, 1, true), k(2, 3, 150, 32, DType::bf16, 2, true);
  Heads v(2, 3, 150, 32, DType::bf16, 3, true);
  std::vector<std::vector<uint16_t>> results;
  // 16 threads make the query blocks 16 rows (too few tasks for 64): the results must not move with them.
  for (int threads : {1, 3, 8, 16}) {
    set_num_threads(threads);
    Heads out(2, 3, 150, 32, DType::bf16, 4);
    attention::scaled_dot_product(q.view(), k.view(), v.view(), nullptr, true, 0.2, out.view());
    results.push_back(out.storage.bf16);
  }
  // The few-query path: one query a head against 1100 keys in 5 chunks, grouped heads.
  Heads q1(2, 4, 1, 64, DType::bf16, 5, true), k1(2, 2, 1100, 64, DType::bf16, 6, true);
  Heads v1(2, 2, 1100, 64, DType::bf16, 7, true);
  for (int threads : {1, 3, 8, 16}) {
    set_num_threads(threads);
    Heads out(2, 4, 1, 64, DType::bf16, 8);
    attention::scaled_dot_product(q1.view(), k1.view(), v1.view(), nullptr, false, 0.125, out.view());
    results.push_back(out.storage.bf16);
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(results[0], results[3]);
  EXPECT_EQ(results[4], results[5]);
  EXPECT_EQ(results[4], results[6]);
  EXPECT_EQ(results[4], results[7]);
}

TEST(Attention, BadArgumentsThrowAndWriteNothing) {
  Heads q(1, 4, 6, 8, DType::f32, 1), k(1, 2, 5, 8, DType::f32, 2), v(1, 2, 5, 8, DType::f32, 3);
  Heads out(1, 4, 6, 8, DType::f32, 4);
  Heads k_bf16(1, 2, 5, 8, DType::bf16, 2), k_three_heads(1, 3, 5, 8, DType::f32, 2),
      v_short(1, 2, 4, 8, DType::f32, 3);
  Heads out_wrong(1, 4, 6, 7, DType::f32, 4);
  Mask bad_mask({6, 4}, DType::f32, 5);
  Mask int_mask({6, 5}, DType::f32, 5);
  const std::vector<float> before = out.storage.f32;
  const TensorView bad_mask_view = bad_mask.view();
  TensorView int_mask_view = int_mask.view();
  int_mask_view = TensorView(int_mask_view.data(), DType::i32, {6, 5});
  const TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view();
  const int64_t sizes[4] = {1, 4, 6, 8}, broadcast[4] = {0, 8, 0, 1};
  const TensorView out_broadcast(out.storage.f32.data(), DType::f32, sizes, broadcast, 4);
  const int64_t gap_strides[4] = {4 * 6 * 16, 6 * 16, 16, 1};
  std::vector<float> roomy(4 * 6 * 16);
  const TensorView out_gappy(roomy.data(), DType::f32, sizes, gap_strides, 4);

  EXPECT_THROW(attention::scaled_dot_product(qv, k_bf16.view(), vv, nullptr, false, 1.0, ov), TypeError);
  EXPECT_THROW(attention::scaled_dot_product(qv, k_three_heads.view(), vv, nullptr, false, 1.0, ov), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, v_short.view(), nullptr, false, 1.0, ov), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1.0, out_wrong.view()), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, &bad_mask_view, false, 1.0, ov), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, &int_mask_view, false, 1.0, ov), TypeError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, INFINITY, ov), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1e300, ov), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1.0, out_broadcast), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1.0, out_gappy), ValueError);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1.0, qv), ValueError);  // out over q
  const int64_t flat[3] = {4, 6, 8}, flat_strides[3] = {48, 8, 1};
  const TensorView three_d(out.storage.f32.data(), DType::f32, flat, flat_strides, 3);
  EXPECT_THROW(attention::scaled_dot_product(qv, kv, vv, nullptr, false, 1.0, three_d), ValueError);
  EXPECT_EQ(out.storage.f32, before);
}

}  // namespace
}  // namespace ember
