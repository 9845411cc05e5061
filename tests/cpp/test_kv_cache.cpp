// The paged key/value cache (ember/kv_cache.h) and the attention over it (ember/attention.h: over_cache): tokens
// written over several steps (some kept, some skipped as padding) read back exactly; blocks shared after a reorder
// and copied before a shared block is written; truncation and the pool's reuse of blocks; checks that write
// nothing; and attention against a double-precision reference over sequences of different lengths, grouped-query
// heads, key limits and a sliding window, on every ISA path, float32 and bfloat16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ember/attention.h"
#include "ember/errors.h"
#include "ember/kv_cache.h"
#include "ember/parallel.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using kv_cache::BlockPool;
using kv_cache::Layout;
using kv_cache::PagedCache;

// What a test wrote into a cache, in double: keys[layer][sequence][token][head][feature], values alike.
struct Written {
  int64_t layers, heads, key_dim, value_dim;
  std::vector<std::vector<std::vector<double>>> keys, values;  // [layer][sequence] -> flat [token][head][dim]
  Written(const Layout& l, int64_t sequences)
      : layers(l.layers),
        heads(l.heads),
        key_dim(l.key_dim),
        value_dim(l.value_dim),
        keys(static_cast<size_t>(l.layers), std::vector<std::vector<double>>(static_cast<size_t>(sequences))),
        values(keys) {}
  int64_t length(int64_t s) const {
    return static_cast<int64_t>(keys[0][static_cast<size_t>(s)].size()) / (heads * key_dim);
  }
  double key(int64_t layer, int64_t s, int64_t t, int64_t h, int64_t e) const {
    return keys[static_cast<size_t>(layer)][static_cast<size_t>(s)][static_cast<size_t>((t * heads + h) * key_dim + e)];
  }
  double value(int64_t layer, int64_t s, int64_t t, int64_t h, int64_t e) const {
    return values[static_cast<size_t>(layer)][static_cast<size_t>(s)]
                 [static_cast<size_t>((t * heads + h) * value_dim + e)];
  }
};

Layout layout_of(DType dtype, int64_t block_tokens = 4) {
  Layout l;
  l.layers = 2;
  l.heads = 2;
  l.key_dim = 24;
  l.value_dim = 20;
  l.block_tokens = block_tokens;
  l.dtype = dtype;
  return l;
}

// One step: `tokens` new positions of every sequence, those where keep[s][t] stored (all when keep is empty).
void step(PagedCache& cache, Written& w, int64_t tokens, const std::vector<std::vector<uint8_t>>& keep, uint32_t seed) {
  const Layout& l = cache.layout();
  const int64_t n = cache.sequences();
  std::vector<int64_t> counts(static_cast<size_t>(n), tokens);
  std::vector<uint8_t> flags;
  for (int64_t s = 0; s < n; ++s) {
    if (keep.empty()) continue;
    counts[static_cast<size_t>(s)] = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      flags.push_back(keep[static_cast<size_t>(s)][static_cast<size_t>(t)]);
      counts[static_cast<size_t>(s)] += flags.back();
    }
  }
  cache.begin(counts);
  for (int64_t layer = 0; layer < l.layers; ++layer) {
    testing::Matrix k(n * tokens, l.heads * l.key_dim, l.dtype, seed + static_cast<uint32_t>(layer) * 2);
    testing::Matrix v(n * tokens, l.heads * l.value_dim, l.dtype, seed + static_cast<uint32_t>(layer) * 2 + 1);
    const TensorView kv = k.view(), vv = v.view();
    const TensorView k4(kv.data(), l.dtype, {n, tokens, l.heads, l.key_dim});
    const TensorView v4(vv.data(), l.dtype, {n, tokens, l.heads, l.value_dim});
    const int64_t keep_sizes[2] = {n, tokens}, keep_strides[2] = {tokens, 1};
    const TensorView keep_view(flags.data(), DType::boolean, keep_sizes, keep_strides, 2);
    cache.write(layer, k4, v4, keep.empty() ? nullptr : &keep_view);
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t t = 0; t < tokens; ++t) {
        if (!keep.empty() && keep[static_cast<size_t>(s)][static_cast<size_t>(t)] == 0) continue;
        auto& ks = w.keys[static_cast<size_t>(layer)][static_cast<size_t>(s)];
        auto& vs = w.values[static_cast<size_t>(layer)][static_cast<size_t>(s)];
        for (int64_t c = 0; c < l.heads * l.key_dim; ++c) ks.push_back(k.at(s * tokens + t, c));
        for (int64_t c = 0; c < l.heads * l.value_dim; ++c) vs.push_back(v.at(s * tokens + t, c));
      }
    }
  }
  cache.commit();
}

double read(const PagedCache& cache, const char* base, int64_t element) {
  if (cache.layout().dtype == DType::f32) {
    float x = 0;
    std::memcpy(&x, base + element * 4, 4);
    return x;
  }
  uint16_t bits = 0;
  std::memcpy(&bits, base + element * 2, 2);
  const uint32_t wide = uint32_t{bits} << 16;
  float x = 0;
  std::memcpy(&x, &wide, 4);
  return x;
}

// Every stored key and value reads back exactly where the layout says it is.
void expect_contents(const PagedCache& cache, const Written& w) {
  const Layout& l = cache.layout();
  for (int64_t s = 0; s < cache.sequences(); ++s) {
    ASSERT_EQ(cache.length(s), w.length(s)) << "sequence " << s;
    for (int64_t t = 0; t < w.length(s); ++t) {
      const char* block = cache.block_of(s, t);
      const int64_t row = t % l.block_tokens;
      for (int64_t layer = 0; layer < l.layers; ++layer) {
        for (int64_t h = 0; h < l.heads; ++h) {
          for (int64_t e = 0; e < l.key_dim; ++e) {
            ASSERT_EQ(read(cache, block + l.key_offset(layer, h), row * l.key_dim + e), w.key(layer, s, t, h, e));
          }
          for (int64_t e = 0; e < l.value_dim; ++e) {
            ASSERT_EQ(read(cache, block + l.value_offset(layer, h), row * l.value_dim + e), w.value(layer, s, t, h, e));
          }
        }
      }
    }
  }
}

TEST(KVCache, StepsWriteEachSequencesKeptTokensInOrder) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    auto pool = std::make_shared<BlockPool>(layout_of(dtype));
    PagedCache cache(pool);
    cache.set_sequences(3);
    Written w(cache.layout(), 3);
    // A left-padded prompt (sequence 0 keeps 2 of 7, sequence 2 none), then decode steps, then a longer step.
    step(cache, w, 7, {{0, 0, 0, 0, 0, 1, 1}, {1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0}}, 10);
    EXPECT_EQ(cache.length(0), 2);
    EXPECT_EQ(cache.length(1), 7);
    EXPECT_EQ(cache.length(2), 0);
    for (uint32_t i = 0; i < 5; ++i) step(cache, w, 1, {}, 20 + i);
    step(cache, w, 9, {}, 40);
    expect_contents(cache, w);
    EXPECT_EQ(cache.max_length(), 7 + 5 + 9);
    // Blocks of 4 tokens: 16, 21 and 14 tokens.
    EXPECT_EQ(cache.blocks_held(), 4 + 6 + 4);
    EXPECT_EQ(pool->blocks_in_use(), 14);
  }
}

TEST(KVCache, ReorderSharesBlocksAndCopiesOnlyTheBlockWrittenNext) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::bf16));
  PagedCache cache(pool);
  cache.set_sequences(2);
  Written w(cache.layout(), 2);
  step(cache, w, 6, {}, 1);  // 6 tokens: one full block and half of another
  EXPECT_EQ(pool->blocks_in_use(), 4);
  // Beam search keeps beam 1 twice: both rows share its two blocks.
  cache.reorder({1, 1});
  for (auto* side : {&w.keys, &w.values}) {
    for (auto& layer : *side) layer[0] = layer[1];
  }
  EXPECT_EQ(pool->blocks_in_use(), 2);
  EXPECT_EQ(cache.blocks_held(), 2);
  // The next token goes into the shared half-filled block: each row gets its own copy of that block only.
  step(cache, w, 1, {}, 2);
  EXPECT_EQ(pool->blocks_in_use(), 3);
  expect_contents(cache, w);
  // A selection of fewer rows, then more than there were.
  cache.reorder({1});
  for (auto* side : {&w.keys, &w.values}) {
    for (auto& layer : *side) layer = {layer[1], layer[1], layer[1]};
  }
  cache.reorder({0, 0, 0});
  step(cache, w, 3, {}, 3);
  expect_contents(cache, w);
}

TEST(KVCache, TruncateAndClearGiveBlocksBackToThePool) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::f32));
  {
    PagedCache cache(pool);
    cache.set_sequences(2);
    Written w(cache.layout(), 2);
    step(cache, w, 10, {}, 1);
    EXPECT_EQ(pool->blocks_in_use(), 6);
    cache.truncate({5, 100});
    EXPECT_EQ(cache.length(0), 5);
    EXPECT_EQ(cache.length(1), 10);
    EXPECT_EQ(pool->blocks_in_use(), 2 + 3);
    for (auto* side : {&w.keys, &w.values}) {
      for (auto& layer : *side)
        layer[0].resize(static_cast<size_t>(5 * w.heads * (side == &w.keys ? w.key_dim : w.value_dim)));
    }
    step(cache, w, 2, {}, 2);
    expect_contents(cache, w);
    const int64_t blocks = pool->blocks();
    cache.clear();
    EXPECT_EQ(pool->blocks_in_use(), 0);
    EXPECT_EQ(pool->blocks(), blocks);  // kept for the next cache
  }
  // A second cache on the same pool reuses the blocks; trim frees what none uses.
  PagedCache next(pool);
  next.set_sequences(1);
  Written w(next.layout(), 1);
  step(next, w, 3, {}, 5);
  expect_contents(next, w);
  EXPECT_EQ(pool->blocks_in_use(), 1);
  next.clear();
  EXPECT_GT(pool->trim(), 0);
  EXPECT_EQ(pool->blocks(), 0);
}

TEST(KVCache, ReserveAllocatesThePoolAhead) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::bf16));
  pool->reserve(40);
  EXPECT_EQ(pool->blocks(), 40);
  EXPECT_EQ(pool->bytes(), 40 * pool->layout().block_bytes());
  PagedCache cache(pool);
  cache.set_sequences(4);
  Written w(cache.layout(), 4);
  step(cache, w, 40, {}, 1);  // 4 x 10 blocks: no growth
  EXPECT_EQ(pool->blocks(), 40);
  expect_contents(cache, w);
}

TEST(KVCache, BadCallsThrowAndWriteNothing) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::f32));
  PagedCache cache(pool);
  cache.set_sequences(2);
  Written w(cache.layout(), 2);
  step(cache, w, 3, {}, 1);
  const Layout& l = cache.layout();
  testing::Matrix k(2 * 2, l.heads * l.key_dim, DType::f32, 9), v(2 * 2, l.heads * l.value_dim, DType::f32, 10);
  const TensorView k4(k.view().data(), DType::f32, {2, 2, l.heads, l.key_dim});
  const TensorView v4(v.view().data(), DType::f32, {2, 2, l.heads, l.value_dim});
  EXPECT_THROW(cache.write(0, k4, v4, nullptr), RuntimeError);  // no step begun
  EXPECT_THROW(cache.begin({2}), ValueError);                   // one count per sequence
  EXPECT_THROW(cache.begin({2, -1}), ValueError);
  cache.begin({2, 1});
  EXPECT_THROW(cache.write(0, k4, v4, nullptr), ValueError);  // sequence 1 keeps 2 tokens, the step said 1
  EXPECT_THROW(cache.write(2, k4, v4, nullptr), IndexError);
  const TensorView wrong_dim(k.view().data(), DType::f32, {2, 2, l.heads, l.key_dim - 1});
  EXPECT_THROW(cache.write(0, wrong_dim, v4, nullptr), ValueError);
  const TensorView as_bf16(k.view().data(), DType::bf16, {2, 2, l.heads, l.key_dim});
  EXPECT_THROW(cache.write(0, as_bf16, v4, nullptr), TypeError);
  EXPECT_THROW(cache.begin({1, 1}), RuntimeError);  // a step in progress
  EXPECT_THROW(cache.reorder({0}), RuntimeError);
  cache.cancel();
  EXPECT_THROW(cache.reorder({2}), IndexError);
  EXPECT_THROW(cache.truncate({1}), ValueError);
  expect_contents(cache, w);  // nothing of the failed calls was written
  Layout bad = layout_of(DType::f32);
  bad.block_tokens = 0;
  EXPECT_THROW(BlockPool{bad}, ValueError);
  bad = layout_of(DType::i32);
  EXPECT_THROW(BlockPool{bad}, TypeError);
}

// Attention over the cache against the definition in double: query (b, i) sees keys [limit - window, limit).
void check_attention(const PagedCache& cache, const Written& w, int64_t layer, int64_t heads_q, int64_t len_q,
                     const std::vector<int64_t>* limits, int64_t window, Isa isa, double softcap = 0.0) {
  const Layout& l = cache.layout();
  const int64_t batch = cache.sequences();
  testing::Matrix q(batch * heads_q * len_q, l.key_dim, l.dtype, 77);
  testing::Matrix out(batch * heads_q * len_q, l.value_dim, l.dtype, 78);
  const TensorView q4(q.view().data(), l.dtype, {batch, heads_q, len_q, l.key_dim});
  const TensorView o4(out.view().data(), l.dtype, {batch, heads_q, len_q, l.value_dim});
  std::vector<int64_t> limit_data = limits != nullptr ? *limits : std::vector<int64_t>{};
  const TensorView limit_view(limit_data.data(), DType::i64, {batch, len_q});
  const double scale = 1.0 / std::sqrt(static_cast<double>(l.key_dim));
  attention::over_cache(q4, cache, layer, limits != nullptr ? &limit_view : nullptr, window, scale, o4, softcap);
  const int64_t group = heads_q / l.heads;
  const double relative = l.dtype == DType::bf16 ? 1.0 / 256 : 2e-6,
               absolute = l.dtype == DType::bf16 ? 1.0 / 128 : 2e-6;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads_q; ++h) {
      for (int64_t i = 0; i < len_q; ++i) {
        const int64_t row = (b * heads_q + h) * len_q + i;
        const int64_t end =
            limits != nullptr ? (*limits)[static_cast<size_t>(b * len_q + i)] : w.length(b) - len_q + 1 + i;
        const int64_t begin = window > 0 ? std::max<int64_t>(0, end - window) : 0;
        std::vector<double> s;
        double top = -INFINITY;
        for (int64_t j = begin; j < end; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < l.key_dim; ++e) dot += q.at(row, e) * w.key(layer, b, j, h / group, e);
          s.push_back(softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale);
          top = std::max(top, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += x = std::exp(x - top);
        for (int64_t c = 0; c < l.value_dim; ++c) {
          double acc = 0;
          for (int64_t j = begin; j < end; ++j)
            acc += s[static_cast<size_t>(j - begin)] * w.value(layer, b, j, h / group, c);
          const double want = sum > 0 ? acc / sum : 0.0;
          ASSERT_NEAR(out.at(row, c), want, relative * std::abs(want) + absolute)
              << "isa " << isa_name(isa) << " " << dtype_name(l.dtype) << " b " << b << " h " << h << " i " << i
              << " c " << c << " keys [" << begin << ", " << end << ")";
        }
      }
    }
  }
}

TEST(KVCache, AttentionOverTheCacheMatchesTheDefinition) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      auto pool = std::make_shared<BlockPool>(layout_of(dtype, 16));
      PagedCache cache(pool);
      cache.set_sequences(3);
      Written w(cache.layout(), 3);
      // Lengths 300 (past a 256-key chunk), 21 and 540 after a padded prompt and a few decode steps.
      std::vector<std::vector<uint8_t>> keep(3, std::vector<uint8_t>(280, 1));
      for (int64_t t = 0; t < 260; ++t) keep[1][static_cast<size_t>(t)] = 0;
      step(cache, w, 280, keep, 1);
      step(cache, w, 260,
           {{std::vector<uint8_t>(260, 0)}, {std::vector<uint8_t>(260, 0)}, {std::vector<uint8_t>(260, 1)}}, 2);
      step(cache, w, 1, {}, 3);
      step(cache, w, 20, {{std::vector<uint8_t>(20, 1)}, {std::vector<uint8_t>(20, 1)}, {std::vector<uint8_t>(20, 0)}},
           4);
      ASSERT_EQ(cache.length(0), 301);
      ASSERT_EQ(cache.length(1), 41);
      ASSERT_EQ(cache.length(2), 541);
      for (int64_t len_q : {1, 3, 20}) {
        check_attention(cache, w, 1, 4, len_q, nullptr, 0, isa);   // grouped-query: 2 query heads a key head
        check_attention(cache, w, 0, 2, len_q, nullptr, 33, isa);  // a sliding window
      }
      // Limits: some queries see nothing, one everything, the rest in between.
      std::vector<int64_t> limits = {0, 300, 7, 41, 1, 540};
      check_attention(cache, w, 1, 2, 2, &limits, 0, isa);
      check_attention(cache, w, 0, 6, 2, &limits, 100, isa);
      check_attention(cache, w, 1, 4, 3, nullptr, 50, isa, 0.4);  // Gemma 2's soft cap, with its local window
    }
  }
}

TEST(KVCache, AttentionOverTheCacheChecksItsArguments) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::f32));
  PagedCache cache(pool);
  cache.set_sequences(2);
  Written w(cache.layout(), 2);
  step(cache, w, 5, {}, 1);
  const Layout& l = cache.layout();
  testing::Matrix q(2 * 4, l.key_dim, DType::f32, 1), out(2 * 4, l.value_dim, DType::f32, 2);
  const std::vector<double> before = [&] {
    std::vector<double> v;
    for (int64_t r = 0; r < 8; ++r) {
      for (int64_t c = 0; c < l.value_dim; ++c) v.push_back(out.at(r, c));
    }
    return v;
  }();
  const TensorView q4(q.view().data(), DType::f32, {2, 4, 1, l.key_dim});
  const TensorView o4(out.view().data(), DType::f32, {2, 4, 1, l.value_dim});
  const TensorView q3(q.view().data(), DType::f32, {2, 3, 1, l.key_dim});  // 3 heads over 2
  const TensorView q_one(q.view().data(), DType::f32, {1, 4, 1, l.key_dim});
  std::vector<int64_t> too_far = {6, 1};
  const TensorView limits(too_far.data(), DType::i64, {2, 1});
  std::vector<int32_t> narrow = {1, 1};
  const TensorView limits32(narrow.data(), DType::i32, {2, 1});
  EXPECT_THROW(attention::over_cache(q3, cache, 0, nullptr, 0, 1.0, o4), ValueError);
  EXPECT_THROW(attention::over_cache(q_one, cache, 0, nullptr, 0, 1.0, o4), ValueError);
  EXPECT_THROW(attention::over_cache(q4, cache, 2, nullptr, 0, 1.0, o4), IndexError);
  EXPECT_THROW(attention::over_cache(q4, cache, 0, &limits, 0, 1.0, o4), ValueError);
  EXPECT_THROW(attention::over_cache(q4, cache, 0, &limits32, 0, 1.0, o4), TypeError);
  EXPECT_THROW(attention::over_cache(q4, cache, 0, nullptr, -1, 1.0, o4), ValueError);
  EXPECT_THROW(attention::over_cache(q4, cache, 0, nullptr, 0, INFINITY, o4), ValueError);
  EXPECT_THROW(attention::over_cache(q4, cache, 0, nullptr, 0, 1.0, q4), ValueError);  // out is q
  size_t i = 0;
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t c = 0; c < l.value_dim; ++c) ASSERT_EQ(out.at(r, c), before[i++]);
  }
}

// The chunks a sequence's keys split into are fixed by its length: any thread count gives the same bits.
TEST(KVCache, AttentionOverTheCacheDoesNotDependOnTheThreadCount) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::bf16, 16));
  PagedCache cache(pool);
  cache.set_sequences(2);
  Written w(cache.layout(), 2);
  step(cache, w, 700, {}, 1);
  const Layout& l = cache.layout();
  testing::Matrix q(2 * 4, l.key_dim, DType::bf16, 3);
  const TensorView q4(q.view().data(), DType::bf16, {2, 4, 1, l.key_dim});
  std::vector<std::vector<uint16_t>> results;
  const int threads = num_threads();
  for (int n : {1, 3, threads}) {
    set_num_threads(n);
    std::vector<uint16_t> out(static_cast<size_t>(2 * 4 * l.value_dim));
    const TensorView o4(out.data(), DType::bf16, {2, 4, 1, l.value_dim});
    attention::over_cache(q4, cache, 1, nullptr, 0, 0.2, o4);
    results.push_back(out);
  }
  set_num_threads(threads);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

// The block table the attention reads is made again after each change of the blocks (a step's new block, a reorder
// that shares and copies blocks, a truncation): attention between the changes reads the current blocks.
TEST(KVCache, AttentionReadsTheBlocksAfterEachChange) {
  auto pool = std::make_shared<BlockPool>(layout_of(DType::f32));
  PagedCache cache(pool);
  cache.set_sequences(2);
  Written w(cache.layout(), 2);
  step(cache, w, 6, {}, 1);
  check_attention(cache, w, 0, 2, 1, nullptr, 0, Isa::ref);
  cache.reorder({1, 0});
  for (auto* side : {&w.keys, &w.values}) {
    for (auto& layer : *side) std::swap(layer[0], layer[1]);
  }
  check_attention(cache, w, 1, 2, 1, nullptr, 0, Isa::ref);
  step(cache, w, 3, {}, 2);  // new blocks
  check_attention(cache, w, 0, 4, 2, nullptr, 0, Isa::ref);
  cache.truncate({4, 9});
  for (auto* side : {&w.keys, &w.values}) {
    for (auto& layer : *side)
      layer[0].resize(static_cast<size_t>(4 * w.heads * (side == &w.keys ? w.key_dim : w.value_dim)));
  }
  check_attention(cache, w, 1, 2, 1, nullptr, 0, Isa::ref);
}

}  // namespace
}  // namespace ember
