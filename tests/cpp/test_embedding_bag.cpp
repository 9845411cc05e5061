// Merged embedding bags: every ISA path against a double-precision reference of the definitions in
// ember/embedding_bag.h (pooling, gradients, fused SGD and Adagrad), results independent of the thread count, the
// row sort, and bad arguments that throw before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "embedding_bag/row_sort.h"
#include "ember/bf16.h"
#include "ember/embedding_bag.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "isa_test_util.h"

namespace ember {
namespace {

namespace eb = embedding_bag;

// One table's data, owned; views() gives the core's Table.
struct TableData {
  int64_t rows = 0, dim = 0;
  bool bf16 = false;
  std::vector<float> weight;       // float32 weights, or the float values of bf16 ones
  std::vector<uint16_t> weight16;  // bf16 bits
  std::vector<uint16_t> bottom;    // split-BF16 low halves
  std::vector<int64_t> indices, offsets;
  std::vector<int32_t> indices32, offsets32;
  bool idx32 = false;
  std::vector<float> psw;
  bool has_psw = false;

  eb::Table table() {
    eb::Table t;
    t.weight = bf16 ? TensorView(weight16.data(), DType::bf16, {rows, dim})
                    : TensorView(weight.data(), DType::f32, {rows, dim});
    const auto n = static_cast<int64_t>(indices.size()), m = static_cast<int64_t>(offsets.size());
    if (idx32) {
      t.indices = TensorView(indices32.data(), DType::i32, {n});
      t.offsets = TensorView(offsets32.data(), DType::i32, {m});
    } else {
      t.indices = TensorView(indices.data(), DType::i64, {n});
      t.offsets = TensorView(offsets.data(), DType::i64, {m});
    }
    if (has_psw) t.per_sample_weights = TensorView(psw.data(), DType::f32, {n});
    return t;
  }
  // The weight as the float32 values it holds (split-BF16: top and bottom joined).
  float value(int64_t i) const {
    if (!bf16) return weight[i];
    if (!bottom.empty()) return bf16::bits_float(bf16::join_bits(weight16[i], bottom[i]));
    return bf16::widen(weight16[i]);
  }
};

struct CaseSpec {
  int64_t rows, dim, bags, max_bag;
  bool bf16 = false, idx32 = false, psw = false, include_last = false, split = false;
};

TableData make_table(const CaseSpec& spec, std::mt19937& rng) {
  TableData d;
  d.rows = spec.rows;
  d.dim = spec.dim;
  d.bf16 = spec.bf16;
  d.idx32 = spec.idx32;
  d.has_psw = spec.psw;
  std::normal_distribution<float> normal;
  d.weight.resize(static_cast<size_t>(spec.rows * spec.dim));
  for (float& w : d.weight) w = normal(rng);
  if (spec.bf16) {
    d.weight16.resize(d.weight.size());
    if (spec.split) {
      d.bottom.resize(d.weight.size());
      bf16::split(d.weight.data(), d.weight16.data(), d.bottom.data(), static_cast<int64_t>(d.weight.size()));
    } else {
      bf16::round(d.weight.data(), d.weight16.data(), static_cast<int64_t>(d.weight.size()));
    }
  }
  std::uniform_int_distribution<int64_t> length(0, spec.max_bag), row(0, std::max<int64_t>(spec.rows - 1, 0));
  // Skewed rows (a few hot ones), so duplicates within and across bags are common, as in real traffic.
  std::uniform_int_distribution<int64_t> hot(0, std::min<int64_t>(spec.rows, 4) - 1);
  for (int64_t b = 0; b < spec.bags; ++b) {
    d.offsets.push_back(static_cast<int64_t>(d.indices.size()));
    const int64_t len = spec.rows == 0 ? 0 : length(rng);
    for (int64_t k = 0; k < len; ++k) d.indices.push_back(rng() % 3 == 0 ? hot(rng) : row(rng));
  }
  if (spec.include_last) d.offsets.push_back(static_cast<int64_t>(d.indices.size()));
  d.indices32.assign(d.indices.begin(), d.indices.end());
  d.offsets32.assign(d.offsets.begin(), d.offsets.end());
  for (size_t i = 0; i < d.indices.size(); ++i) d.psw.push_back(normal(rng));
  return d;
}

int64_t num_bags(const TableData& d, bool include_last) {
  return static_cast<int64_t>(d.offsets.size()) - (include_last ? 1 : 0);
}
int64_t bag_end(const TableData& d, int64_t b, bool include_last) {
  return b + 1 < static_cast<int64_t>(d.offsets.size()) ? d.offsets[b + 1] : static_cast<int64_t>(d.indices.size());
}
double scale_of(const TableData& d, int64_t p, int64_t b, eb::Mode mode, bool include_last) {
  if (d.has_psw) return d.psw[p];
  if (mode == eb::Mode::mean) return 1.0 / static_cast<double>(bag_end(d, b, include_last) - d.offsets[b]);
  return 1.0;
}

// out[b] in double: the definition.
std::vector<double> pool_reference(const TableData& d, eb::Mode mode, bool include_last) {
  const int64_t bags = num_bags(d, include_last);
  std::vector<double> out(static_cast<size_t>(bags * d.dim), 0.0);
  for (int64_t b = 0; b < bags; ++b) {
    for (int64_t p = d.offsets[b]; p < bag_end(d, b, include_last); ++p) {
      const double s = scale_of(d, p, b, mode, include_last);
      for (int64_t c = 0; c < d.dim; ++c) out[b * d.dim + c] += s * d.value(d.indices[p] * d.dim + c);
    }
  }
  return out;
}

// dW as a map row -> gradient, in double.
std::map<int64_t, std::vector<double>> grad_reference(const TableData& d, const std::vector<float>& grad_out,
                                                      eb::Mode mode, bool include_last) {
  std::map<int64_t, std::vector<double>> g;
  for (int64_t b = 0; b < num_bags(d, include_last); ++b) {
    for (int64_t p = d.offsets[b]; p < bag_end(d, b, include_last); ++p) {
      auto& row = g[d.indices[p]];
      row.resize(static_cast<size_t>(d.dim), 0.0);
      const double s = scale_of(d, p, b, mode, include_last);
      for (int64_t c = 0; c < d.dim; ++c) row[c] += s * grad_out[b * d.dim + c];
    }
  }
  return g;
}

// Random gradients of the outputs, as float values (exact in bf16 when the table is bf16).
std::vector<float> random_grad(const TableData& d, bool include_last, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> g(static_cast<size_t>(num_bags(d, include_last) * d.dim));
  for (float& x : g) x = d.bf16 ? bf16::widen(bf16::round_bits(bf16::float_bits(normal(rng)))) : normal(rng);
  return g;
}

// A [bags, dim] tensor of the table's dtype holding `values` (bf16 values must be exact).
struct RowsTensor {
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  TensorView view;
  RowsTensor(const std::vector<float>& values, const TableData& d, int64_t bags) : f32(values) {
    if (d.bf16) {
      for (float x : values) b16.push_back(static_cast<uint16_t>(bf16::float_bits(x) >> 16));
      view = TensorView(b16.data(), DType::bf16, {bags, d.dim});
    } else {
      view = TensorView(f32.data(), DType::f32, {bags, d.dim});
    }
  }
  float at(size_t i) const { return b16.empty() ? f32[i] : bf16::widen(b16[i]); }
};

std::vector<CaseSpec> specs() {
  std::vector<CaseSpec> out;
  for (bool bf16 : {false, true}) {
    for (int64_t dim : {1, 7, 16, 33, 128, 130}) {
      // Bags of up to 9 indices and, for three widths, up to 24: on AMD the pooling prefetches every line of a row
      // for the short ones and the first line for the long ones (embedding_bag.cpp, row_prefetch).
      CaseSpec s{257, dim, 23, dim == 16 || dim >= 128 ? 24 : 9};
      s.bf16 = bf16;
      s.idx32 = dim % 2 == 1;
      s.psw = dim == 33 || dim == 128;
      s.include_last = dim == 7 || dim == 128;
      out.push_back(s);
    }
  }
  return out;
}

double tolerance(const TableData& d) { return d.bf16 ? 1.0 / 128 : 2e-5; }

TEST(EmbeddingBag, ForwardMatchesTheDefinitionOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (eb::Mode mode : {eb::Mode::sum, eb::Mode::mean}) {
      std::mt19937 rng(7);
      std::vector<TableData> data;
      for (CaseSpec spec : specs()) {
        if (mode == eb::Mode::mean) spec.psw = false;
        data.push_back(make_table(spec, rng));
      }
      // One call per include_last_offset setting (an option of the call, not of a table).
      for (bool include_last : {false, true}) {
        std::vector<eb::Table> tables;
        std::vector<TableData*> used;
        for (TableData& d : data) {
          if ((d.offsets.size() == 24) == include_last) {  // 23 bags, plus the last offset when include_last
            tables.push_back(d.table());
            used.push_back(&d);
          }
        }
        std::vector<std::vector<float>> out_f(tables.size());
        std::vector<std::vector<uint16_t>> out_h(tables.size());
        std::vector<TensorView> outs;
        for (size_t t = 0; t < tables.size(); ++t) {
          const int64_t bags = num_bags(*used[t], include_last), dim = used[t]->dim;
          out_f[t].assign(static_cast<size_t>(bags * dim), -1.0f);
          out_h[t].assign(static_cast<size_t>(bags * dim), 0xFFFF);
          outs.push_back(used[t]->bf16 ? TensorView(out_h[t].data(), DType::bf16, {bags, dim})
                                       : TensorView(out_f[t].data(), DType::f32, {bags, dim}));
        }
        eb::forward(tables, outs, {mode, include_last});
        for (size_t t = 0; t < tables.size(); ++t) {
          const std::vector<double> ref = pool_reference(*used[t], mode, include_last);
          for (size_t i = 0; i < ref.size(); ++i) {
            const float got = used[t]->bf16 ? bf16::widen(out_h[t][i]) : out_f[t][i];
            ASSERT_NEAR(got, ref[i], tolerance(*used[t]) * (1.0 + std::fabs(ref[i])))
                << isa_name(isa) << " table " << t << " element " << i;
          }
        }
      }
    }
  }
}

// Tables large enough that each is split into several runs, one per thread slot: the same values for any thread
// count, and equal to the definition.
TEST(EmbeddingBag, ForwardSplitsLargeTablesOverThreadsWithTheSameResult) {
  std::mt19937 rng(5);
  std::vector<TableData> data;
  for (int64_t rows : {50, 3000, 40000}) data.push_back(make_table({rows, 64, 700, 40}, rng));
  std::vector<eb::Table> tables;
  for (TableData& d : data) tables.push_back(d.table());
  auto run = [&](int threads) {
    std::vector<std::vector<float>> outs(data.size());
    std::vector<TensorView> views;
    for (size_t t = 0; t < data.size(); ++t) {
      outs[t].assign(static_cast<size_t>(700 * 64), -1.0f);
      views.push_back(TensorView(outs[t].data(), DType::f32, {700, 64}));
    }
    const int saved = num_threads();
    set_num_threads(threads);
    eb::forward(tables, views, {});
    set_num_threads(saved);
    return outs;
  };
  const auto one = run(1);
  for (size_t t = 0; t < data.size(); ++t) {
    const std::vector<double> ref = pool_reference(data[t], eb::Mode::sum, false);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(one[t][i], ref[i], 2e-5 * (1.0 + std::fabs(ref[i])));
  }
  for (int threads : {2, 3, 7}) EXPECT_EQ(run(threads), one) << threads << " threads";
}

// Bad indices in several tables: the message names the lowest table's first one whatever the split.
TEST(EmbeddingBag, TheFirstBadIndexIsReportedForAnyThreadCount) {
  std::mt19937 rng(9);
  TableData a = make_table({100, 32, 2000, 20}, rng), b = make_table({100, 32, 2000, 20}, rng);
  a.indices[a.indices.size() - 3] = 100;  // late in table 0: a late slot
  a.indices[a.indices.size() - 1] = 101;
  b.indices[2] = -5;  // early in table 1: slot 0
  std::vector<float> out_a(2000 * 32), out_b(2000 * 32);
  const std::vector<TensorView> outs = {TensorView(out_a.data(), DType::f32, {2000, 32}),
                                        TensorView(out_b.data(), DType::f32, {2000, 32})};
  const int saved = num_threads();
  for (int threads : {1, 4}) {
    set_num_threads(threads);
    try {
      eb::forward({a.table(), b.table()}, outs, {});
      ADD_FAILURE() << "no IndexError with " << threads << " threads";
    } catch (const IndexError& e) {
      const std::string expected = "indices[0][" + std::to_string(a.indices.size() - 3) + "] is 100";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  set_num_threads(saved);
}

TEST(EmbeddingBag, EmptyBagsGiveZerosAndEmptyTablesWork) {
  TableData d;
  d.rows = 0;
  d.dim = 4;
  d.offsets = {0, 0, 0};
  eb::Table empty = d.table();
  std::vector<float> out(12, 5.0f);
  eb::forward({empty}, {TensorView(out.data(), DType::f32, {3, 4})}, {eb::Mode::mean, false});
  for (float x : out) EXPECT_EQ(x, 0.0f);
  const auto grads = eb::backward({empty}, {TensorView(out.data(), DType::f32, {3, 4})}, {});
  EXPECT_TRUE(grads[0].rows.empty());
}

TEST(EmbeddingBag, GradientSumsDuplicatesInPositionOrderForAnyThreadCount) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (eb::Mode mode : {eb::Mode::sum, eb::Mode::mean}) {
      std::mt19937 rng(11);
      std::vector<TableData> data;
      std::vector<RowsTensor> grads;
      std::vector<eb::Table> tables;
      std::vector<TensorView> grad_views;
      for (CaseSpec spec : specs()) {
        spec.include_last = false;
        if (mode == eb::Mode::mean) spec.psw = false;
        data.push_back(make_table(spec, rng));
      }
      for (TableData& d : data) {
        grads.emplace_back(random_grad(d, false, rng), d, num_bags(d, false));
        tables.push_back(d.table());
      }
      for (const RowsTensor& g : grads) grad_views.push_back(g.view);
      const int saved = num_threads();
      set_num_threads(1);
      const auto one = eb::backward(tables, grad_views, {mode, false});
      set_num_threads(3);
      const auto three = eb::backward(tables, grad_views, {mode, false});
      set_num_threads(saved);
      for (size_t t = 0; t < tables.size(); ++t) {
        std::vector<float> g(grads[t].f32.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = grads[t].at(i);
        const auto ref = grad_reference(data[t], g, mode, false);
        const auto& got = std::get<std::vector<float>>(one[t].values);
        const auto& got3 = std::get<std::vector<float>>(three[t].values);
        ASSERT_EQ(one[t].rows.size(), ref.size()) << "table " << t;
        size_t k = 0;
        for (const auto& [row, values] : ref) {
          ASSERT_EQ(one[t].rows[k], row);
          for (int64_t c = 0; c < data[t].dim; ++c) {
            ASSERT_NEAR(got[k * data[t].dim + c], values[c], 2e-5 * (1.0 + std::fabs(values[c])))
                << isa_name(isa) << " table " << t << " row " << row;
          }
          ++k;
        }
        ASSERT_EQ(one[t].rows, three[t].rows);
        ASSERT_EQ(0, std::memcmp(got.data(), got3.data(), got.size() * sizeof(float)))
            << "the thread count changed table " << t << "'s gradient";
      }
    }
  }
}

TEST(EmbeddingBag, PerSampleWeightGradientIsTheDotOfRowAndOutputGradient) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    std::mt19937 rng(5);
    for (bool bf16 : {false, true}) {
      CaseSpec spec{50, 37, 9, 6};
      spec.bf16 = bf16;
      spec.psw = true;
      spec.include_last = true;
      TableData d = make_table(spec, rng);
      d.indices.push_back(3);  // a position past the last offset: no bag uses it, its gradient is 0
      d.indices32.push_back(3);
      d.psw.push_back(1.0f);
      RowsTensor g(random_grad(d, true, rng), d, num_bags(d, true));
      std::vector<float> grad_psw(d.indices.size(), 7.0f);
      eb::per_sample_weights_backward(
          {d.table()}, {g.view}, {TensorView(grad_psw.data(), DType::f32, {static_cast<int64_t>(grad_psw.size())})},
          {eb::Mode::sum, true});
      for (int64_t b = 0; b < num_bags(d, true); ++b) {
        for (int64_t p = d.offsets[b]; p < d.offsets[b + 1]; ++p) {
          double dot = 0;
          for (int64_t c = 0; c < d.dim; ++c) dot += double(d.value(d.indices[p] * d.dim + c)) * g.at(b * d.dim + c);
          ASSERT_NEAR(grad_psw[p], dot, 1e-4 * (1.0 + std::fabs(dot))) << isa_name(isa) << " position " << p;
        }
      }
      EXPECT_EQ(grad_psw.back(), 0.0f);
    }
  }
}

// Applies the fused update and the double reference of it to copies of the same tables and compares.
void check_update(bool adagrad, bool bf16, bool split, double weight_decay) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    std::mt19937 rng(3);
    CaseSpec spec{97, 40, 31, 7};
    spec.bf16 = bf16;
    spec.split = split;
    spec.psw = true;
    TableData d = make_table(spec, rng);
    RowsTensor g(random_grad(d, false, rng), d, num_bags(d, false));
    std::vector<float> grad_values(g.f32.size());
    for (size_t i = 0; i < grad_values.size(); ++i) grad_values[i] = g.at(i);
    const auto dw = grad_reference(d, grad_values, eb::Mode::sum, false);
    std::vector<float> state_sum(d.weight.size());
    for (float& s : state_sum) s = 0.1f * static_cast<float>(rng() % 10);
    float step = 4.0f;
    const double lr = 0.05, lr_decay = 0.01, eps = 1e-6;
    // Reference on the float32 values the table holds.
    std::vector<double> expect(d.weight.size()), expect_sum(state_sum.begin(), state_sum.end());
    for (size_t i = 0; i < expect.size(); ++i) expect[i] = d.value(static_cast<int64_t>(i));
    const double clr = lr / (1.0 + (step + 1.0 - 1.0) * lr_decay);
    for (const auto& [row, values] : dw) {
      for (int64_t c = 0; c < d.dim; ++c) {
        double& w = expect[row * d.dim + c];
        double grad = values[c] + weight_decay * w;
        if (adagrad) {
          double& sum = expect_sum[row * d.dim + c];
          sum += grad * grad;
          w -= clr * grad / (std::sqrt(sum) + eps);
        } else {
          w -= lr * grad;
        }
      }
    }
    eb::UpdateState state;
    if (split) state.bottom = TensorView(d.bottom.data(), DType::i16, {d.rows, d.dim});
    if (adagrad) {
      state.state_sum = TensorView(state_sum.data(), DType::f32, {d.rows, d.dim});
      state.step = TensorView(&step, DType::f32, {1});
      eb::adagrad_update({d.table()}, {g.view}, {state}, {}, {lr, lr_decay, weight_decay, eps});
      EXPECT_EQ(step, 5.0f);
    } else {
      eb::sgd_update({d.table()}, {g.view}, {state}, {}, {lr, weight_decay});
    }
    // bf16 storage rounds the result once; split-BF16 and float32 keep float32 precision.
    const double tol = bf16 && !split ? 1.0 / 128 : 1e-5;
    for (size_t i = 0; i < expect.size(); ++i) {
      ASSERT_NEAR(d.value(static_cast<int64_t>(i)), expect[i], tol * (1.0 + std::fabs(expect[i])))
          << isa_name(isa) << " element " << i << (dw.count(static_cast<int64_t>(i) / d.dim) ? " (touched)" : "");
      if (adagrad) {
        ASSERT_NEAR(state_sum[i], expect_sum[i], 1e-5 * (1.0 + expect_sum[i]));
      }
    }
  }
}

TEST(EmbeddingBag, FusedSgdUpdatesTouchedRowsOnly) {
  check_update(false, false, false, 0.0);
  check_update(false, false, false, 0.01);
  check_update(false, true, false, 0.0);
  check_update(false, true, true, 0.01);
}

TEST(EmbeddingBag, FusedAdagradUpdatesTouchedRowsAndTheirState) {
  check_update(true, false, false, 0.0);
  check_update(true, false, false, 0.01);
  check_update(true, true, false, 0.0);
  check_update(true, true, true, 0.01);
}

TEST(EmbeddingBag, BadArgumentsThrowBeforeAnythingIsWritten) {
  std::mt19937 rng(1);
  CaseSpec spec{20, 8, 5, 4};
  TableData d = make_table(spec, rng);
  d.indices[d.indices.size() / 2] = 20;  // one past the last row
  const std::vector<float> before = d.weight;
  std::vector<float> grad(5 * 8, 1.0f), out(5 * 8, 0.0f);
  const TensorView grad_view(grad.data(), DType::f32, {5, 8}), out_view(out.data(), DType::f32, {5, 8});
  EXPECT_THROW(eb::forward({d.table()}, {out_view}, {}), IndexError);
  EXPECT_THROW(eb::sgd_update({d.table()}, {grad_view}, {eb::UpdateState{}}, {}, {0.1, 0.0}), IndexError);
  EXPECT_EQ(d.weight, before);
  d.indices[d.indices.size() / 2] = -1;
  EXPECT_THROW(eb::backward({d.table()}, {grad_view}, {}), IndexError);
  d.indices[d.indices.size() / 2] = 0;

  TableData decreasing = d;
  std::swap(decreasing.offsets[1], decreasing.offsets[3]);
  if (decreasing.offsets[1] != decreasing.offsets[3]) {
    EXPECT_THROW(eb::forward({decreasing.table()}, {out_view}, {}), ValueError);
  }
  TableData late_start = d;
  late_start.offsets[0] = 1;
  EXPECT_THROW(eb::forward({late_start.table()}, {out_view}, {}), ValueError);
  std::vector<float> wide(5 * 9);
  EXPECT_THROW(eb::forward({d.table()}, {TensorView(wide.data(), DType::f32, {5, 9})}, {}), ValueError);
  EXPECT_THROW(eb::forward({d.table()}, {}, {}), ValueError);
  TableData weighted = d;
  weighted.has_psw = true;
  EXPECT_THROW(eb::forward({weighted.table()}, {out_view}, {eb::Mode::mean, false}), ValueError);
  // An output on top of the weights, and an update whose weight is also its gradient.
  EXPECT_THROW(eb::forward({d.table()}, {TensorView(d.weight.data(), DType::f32, {5, 8})}, {}), ValueError);
  EXPECT_THROW(eb::sgd_update({d.table()}, {grad_view}, {eb::UpdateState{}}, {}, {-0.1, 0.0}), ValueError);
  EXPECT_THROW(eb::adagrad_update({d.table()}, {grad_view}, {eb::UpdateState{}}, {}, {}), ValueError);
  EXPECT_EQ(d.weight, before);
}

// A float64 table: normal doubles, so a float32 step anywhere (a load, a sum, a scale) would lose ~29 bits and show.
struct Table64 {
  int64_t rows = 0, dim = 0;
  std::vector<double> weight, psw;
  std::vector<int64_t> indices, offsets;
  bool has_psw = false;

  Table64(int64_t rows_, int64_t dim_, int64_t bags, bool psw_, std::mt19937& rng)
      : rows(rows_), dim(dim_), has_psw(psw_) {
    std::normal_distribution<double> normal;
    weight.resize(static_cast<size_t>(rows * dim));
    for (double& w : weight) w = normal(rng);
    std::uniform_int_distribution<int64_t> length(0, 6), row(0, rows - 1);
    for (int64_t b = 0; b < bags; ++b) {
      offsets.push_back(static_cast<int64_t>(indices.size()));
      for (int64_t k = length(rng); k > 0; --k) indices.push_back(row(rng) / (rng() % 2 + 1));  // duplicates
    }
    for (size_t i = 0; i < indices.size(); ++i) psw.push_back(normal(rng));
  }
  eb::Table table() {
    eb::Table t;
    t.weight = TensorView(weight.data(), DType::f64, {rows, dim});
    t.indices = TensorView(indices.data(), DType::i64, {static_cast<int64_t>(indices.size())});
    t.offsets = TensorView(offsets.data(), DType::i64, {static_cast<int64_t>(offsets.size())});
    if (has_psw) t.per_sample_weights = TensorView(psw.data(), DType::f64, {static_cast<int64_t>(psw.size())});
    return t;
  }
  int64_t bags() const { return static_cast<int64_t>(offsets.size()); }
  int64_t end(int64_t b) const { return b + 1 < bags() ? offsets[b + 1] : static_cast<int64_t>(indices.size()); }
  double scale(int64_t p, int64_t b, eb::Mode mode) const {
    if (has_psw) return psw[p];
    return mode == eb::Mode::mean ? 1.0 / static_cast<double>(end(b) - offsets[b]) : 1.0;
  }
};

// float64 tables run one double path under every ISA cap: lookups, row gradients and per-sample-weight gradients
// equal the definition to double rounding (the order of the sums is the definition's, so 1e-14 is loose).
TEST(EmbeddingBag, Float64TablesComputeInDoubleOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (eb::Mode mode : {eb::Mode::sum, eb::Mode::mean}) {
      std::mt19937 rng(17);
      std::vector<Table64> data;
      for (int64_t dim : {1, 5, 16, 37}) data.emplace_back(11, dim, 9, mode == eb::Mode::sum && dim % 2 == 1, rng);
      std::vector<eb::Table> tables;
      std::vector<std::vector<double>> outs, grads, dpsw;
      std::vector<TensorView> out_views, grad_views;
      std::vector<std::optional<TensorView>> dpsw_views;
      std::normal_distribution<double> normal;
      for (Table64& d : data) {
        tables.push_back(d.table());
        outs.emplace_back(static_cast<size_t>(d.bags() * d.dim), -1.0);
        grads.emplace_back(static_cast<size_t>(d.bags() * d.dim));
        for (double& g : grads.back()) g = normal(rng);
        dpsw.emplace_back(d.indices.size(), -1.0);
      }
      for (size_t t = 0; t < data.size(); ++t) {
        out_views.push_back(TensorView(outs[t].data(), DType::f64, {data[t].bags(), data[t].dim}));
        grad_views.push_back(TensorView(grads[t].data(), DType::f64, {data[t].bags(), data[t].dim}));
        dpsw_views.push_back(data[t].has_psw ? std::optional<TensorView>(TensorView(
                                                   dpsw[t].data(), DType::f64, {static_cast<int64_t>(dpsw[t].size())}))
                                             : std::nullopt);
      }
      eb::forward(tables, out_views, {mode, false});
      const auto row_grads = eb::backward(tables, grad_views, {mode, false});
      if (mode == eb::Mode::sum) eb::per_sample_weights_backward(tables, grad_views, dpsw_views, {mode, false});
      for (size_t t = 0; t < data.size(); ++t) {
        const Table64& d = data[t];
        std::map<int64_t, std::vector<double>> dw;
        for (int64_t b = 0; b < d.bags(); ++b) {
          std::vector<double> out(static_cast<size_t>(d.dim), 0.0);
          for (int64_t p = d.offsets[b]; p < d.end(b); ++p) {
            const double s = d.scale(p, b, mode);
            auto& row = dw[d.indices[p]];
            row.resize(static_cast<size_t>(d.dim), 0.0);
            double dot = 0.0;
            for (int64_t c = 0; c < d.dim; ++c) {
              out[c] += s * d.weight[d.indices[p] * d.dim + c];
              row[c] += s * grads[t][b * d.dim + c];
              dot += d.weight[d.indices[p] * d.dim + c] * grads[t][b * d.dim + c];
            }
            if (d.has_psw) {
              EXPECT_NEAR(dpsw[t][p], dot, 1e-14 * (1.0 + std::fabs(dot))) << "position " << p;
            }
          }
          for (int64_t c = 0; c < d.dim; ++c) {
            EXPECT_NEAR(outs[t][b * d.dim + c], out[c], 1e-14 * (1.0 + std::fabs(out[c])))
                << isa_name(isa) << " table " << t << " bag " << b;
          }
        }
        const auto& values = std::get<std::vector<double>>(row_grads[t].values);
        ASSERT_EQ(row_grads[t].rows.size(), dw.size());
        size_t k = 0;
        for (const auto& [row, g] : dw) {
          ASSERT_EQ(row_grads[t].rows[k], row);
          for (int64_t c = 0; c < d.dim; ++c) {
            EXPECT_NEAR(values[k * d.dim + c], g[c], 1e-14 * (1.0 + std::fabs(g[c]))) << "row " << row;
          }
          ++k;
        }
      }
    }
  }
}

// float64 tables take float64 per-sample weights, and no fused update.
TEST(EmbeddingBag, Float64TablesRejectFloat32PerSampleWeightsAndFusedUpdates) {
  std::mt19937 rng(3);
  Table64 d(6, 4, 3, true, rng);
  std::vector<double> out(3 * 4, 0.0), grad(3 * 4, 1.0);
  const TensorView out_view(out.data(), DType::f64, {3, 4}), grad_view(grad.data(), DType::f64, {3, 4});
  std::vector<float> psw32(d.indices.size(), 1.0f);
  eb::Table mixed = d.table();
  mixed.per_sample_weights = TensorView(psw32.data(), DType::f32, {static_cast<int64_t>(psw32.size())});
  EXPECT_THROW(eb::forward({mixed}, {out_view}, {}), TypeError);
  const std::vector<double> before = d.weight;
  EXPECT_THROW(eb::sgd_update({d.table()}, {grad_view}, {eb::UpdateState{}}, {}, {0.1, 0.0}), TypeError);
  EXPECT_EQ(d.weight, before);
  std::vector<float> out32(3 * 4);
  EXPECT_THROW(eb::forward({d.table()}, {TensorView(out32.data(), DType::f32, {3, 4})}, {}), TypeError);
  EXPECT_EQ(out, std::vector<double>(3 * 4, 0.0));
}

TEST(RowSort, StableForEverySizeAndRowCount) {
  std::mt19937 rng(9);
  for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{1000}, int64_t{1} << 23, int64_t{10'000'000}}) {
    for (int32_t n : {0, 1, 5, 63, 64, 1000, 20000}) {
      std::vector<int64_t> keys(static_cast<size_t>(n));
      for (auto& k : keys) k = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::min<int64_t>(rows, 50 + n)));
      if (rows > 1000) {
        for (auto& k : keys) k = (k * 7919 + 3) % rows;  // spread over all the digits
      }
      std::vector<int32_t> sorted, scratch;
      embedding_bag::detail::sort_positions(keys.data(), n, rows, sorted, scratch);
      std::vector<int32_t> expect(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) expect[i] = i;
      std::stable_sort(expect.begin(), expect.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
      ASSERT_EQ(sorted, expect) << "rows " << rows << " n " << n;
      std::vector<int64_t> starts, rows_of;
      embedding_bag::detail::find_runs(keys.data(), sorted, starts, rows_of);
      ASSERT_EQ(starts.size(), rows_of.size() + 1);
      for (size_t s = 0; s + 1 < starts.size(); ++s) {
        for (int64_t k = starts[s]; k < starts[s + 1]; ++k) ASSERT_EQ(keys[sorted[k]], rows_of[s]);
        if (s > 0) {
          ASSERT_LT(rows_of[s - 1], rows_of[s]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ember
