// ember::Linear against a float64 reference on random inputs: every compute dtype, output dtype and post-op, with
// and without bias, prepacked and on the caller's layout, strided rows, several input shapes through one layer
// (the primitive cache), and the refusals, which must leave the output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "concurrent_calls.h"
#include "ember/bf16.h"
#include "ember/cpu_features.h"
#include "ember/errors.h"
#include "ember/linear.h"
#include "ember/parallel.h"
#include "epilogue_reference.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::ChainReference;
using testing::Matrix;
using testing::reference_chain;
using testing::to_bf16_and_back;

struct Case {
  DType compute, out_dtype;
  Epilogue epilogue;
  bool bias, prepack;
};

// Checks one forward against the float64 reference. bf16 outputs are allowed their rounding (2^-8 relative) on
// top of the fp32 accumulation error.
void check_forward(const Linear& layer, const Case& c, Matrix& x, Matrix& w, const std::vector<float>& bias,
                   Matrix* residual, uint32_t seed) {
  const int64_t m = x.rows, n = w.rows, k = w.cols;
  Matrix out(m, n, c.out_dtype, seed, /*pad=*/3);
  TensorView rv = residual ? residual->view() : TensorView();
  const TensorView wv = w.view();
  // A prepacked layer runs without its weight too (on the packed copy); give it every other call.
  const bool pass_weight = !c.prepack || seed % 2 == 0;
  layer.forward(x.view(), pass_weight ? &wv : nullptr, out.view(), c.epilogue, residual ? &rv : nullptr);
  const double out_rel = c.out_dtype == DType::bf16 ? 1.0 / 128 : c.out_dtype == DType::f16 ? 1.0 / 1024 : 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = c.bias ? bias[j] : 0.0, scale = c.bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        acc += x.at(i, p) * w.at(j, p);
        scale += std::fabs(x.at(i, p) * w.at(j, p));
      }
      const double r = residual ? residual->at(i, j) : 0.0;
      if (has_operand(c.epilogue)) scale += std::fabs(r);
      const ChainReference want = reference_chain(c.epilogue, acc, r);
      const double slack = c.out_dtype != DType::f32 ? want.bf16_slack : 0.0;  // (over twice enough for f16)
      const double tol = 1e-5 * (scale + 1) + out_rel * std::fabs(want.value) + slack + 1e-6;
      ASSERT_NEAR(out.at(i, j), want.value, tol) << "row " << i << " col " << j << " of " << m << "x" << n << "x" << k;
    }
  }
}

class LinearTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearTest, MatchesFloat64ReferenceAcrossShapes) {
  const Case c = GetParam();
  if (!Linear::supported(c.compute)) GTEST_SKIP() << "oneDNN has no " << dtype_name(c.compute) << " matmul here";
  const int64_t n = 37, k = 70;
  // A bf16 layer's weight may come in fp32 (the model's) or bf16; the prepacked copy is rounded either way.
  Matrix w(n, k, c.prepack ? DType::f32 : c.compute, 1);
  if (c.compute == DType::bf16 && c.prepack) {
    for (float& v : w.f32) v = to_bf16_and_back(v);
  }
  if (c.compute == DType::f16) {  // (always prepacked: a layer takes f32 or bf16 weights)
    for (float& v : w.f32) v = static_cast<float>(static_cast<_Float16>(v));
  }
  Matrix b_src(1, n, DType::f32, 2);
  std::vector<float> bias(b_src.f32.begin(), b_src.f32.begin() + n);
  const TensorView bias_view(bias.data(), DType::f32, {n});
  const Linear layer(w.view(), c.bias ? &bias_view : nullptr, {c.compute, c.prepack});
  uint32_t seed = 10;
  for (int64_t m : {1, 5, 64, 3}) {
    Matrix x(m, k, c.compute, seed++, /*pad=*/m % 2 ? 6 : 0);
    Matrix residual(m, n, c.out_dtype, seed++, /*pad=*/1);
    check_forward(layer, c, x, w, bias, has_operand(c.epilogue) ? &residual : nullptr, seed++);
  }
  // One primitive per shape oneDNN ran, the shapes the router gives it: a layer on the caller's weight runs 1, 5 and
  // 3 rows on the skinny matmul instead, and a packed bf16 layer its 64 rows on the tile matmul where AMX runs and its
  // 1 and 3 rows on the few-row matmul where AVX512-BF16 does (tests/cpp/test_tile_matmul.cpp).
  const size_t cached = layer.cached_primitives();  // (before implementation(), which builds what it names)
  const TensorView wv = w.view();
  size_t on_onednn = 0;
  for (int64_t m : {1, 5, 64, 3}) on_onednn += layer.implementation(m, &wv).rfind("ember:", 0) != 0 ? 1 : 0;
  EXPECT_EQ(cached, on_onednn);
  size_t routed_to_onednn = 0;  // (its plain matmul, or the transposed one)
  for (int64_t m : {1, 5, 64, 3}) {
    const LinearKernel kernel = Linear::route(c.compute, m, wv, !c.prepack, false);
    routed_to_onednn += kernel == LinearKernel::onednn || kernel == LinearKernel::swapped ? 1 : 0;
  }
  EXPECT_EQ(on_onednn, routed_to_onednn);
  if (c.prepack) {
    EXPECT_GE(layer.packed_bytes(), static_cast<size_t>(n * k) * dtype_size(c.compute));
  } else {
    EXPECT_EQ(layer.packed_bytes(), 0u);
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (DType compute : {DType::f32, DType::bf16}) {
    for (DType out : {DType::f32, DType::bf16}) {
      if (compute == DType::f32 && out == DType::bf16) continue;
      cases.push_back({compute, out, {}, true, true});
      cases.push_back({compute, out, {}, false, true});
      cases.push_back({compute, out, {}, true, false});
      for (Activation act : kAllActivations) {
        cases.push_back({compute, out, {PostOp::act(act)}, true, true});
        cases.push_back({compute, out, {PostOp::act(act)}, true, false});
      }
      cases.push_back({compute, out, {PostOp::add()}, true, true});
      cases.push_back({compute, out, {PostOp::add(), PostOp::act(Activation::relu)}, false, true});
      cases.push_back({compute, out, {PostOp::act(Activation::gelu_erf), PostOp::add()}, true, true});
      cases.push_back({compute, out, {PostOp::act(Activation::gelu_erf), PostOp::add()}, true, false});
      cases.push_back({compute, out, {PostOp::multiply()}, true, true});
      cases.push_back({compute, out, {PostOp::act(Activation::silu), PostOp::multiply()}, true, true});
      cases.push_back({compute, out, {PostOp::act(Activation::silu), PostOp::multiply()}, false, false});
    }
  }
  for (DType out : {DType::f32, DType::f16}) {  // float16 layers pack their f32 weights
    cases.push_back({DType::f16, out, {}, true, true});
    cases.push_back({DType::f16, out, {}, false, true});
    cases.push_back({DType::f16, out, {PostOp::act(Activation::gelu_erf)}, true, true});
    cases.push_back({DType::f16, out, {PostOp::add(), PostOp::act(Activation::relu)}, true, true});
    cases.push_back({DType::f16, out, {PostOp::act(Activation::silu), PostOp::multiply()}, true, true});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = std::string(dtype_name(c.compute)) + "_to_" + std::string(dtype_name(c.out_dtype));
  for (const PostOp& op : c.epilogue) {
    name += "_" + std::string(op.kind == PostOp::Kind::add        ? "add"
                              : op.kind == PostOp::Kind::multiply ? "mul"
                                                                  : activation_name(op.activation));
  }
  name += c.bias ? "_bias" : "_nobias";
  name += c.prepack ? "_packed" : "_plain";
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllCases, LinearTest, ::testing::ValuesIn(all_cases()), case_name);

TEST(Linear, OnePackedCopyServesEveryShapeAndEpilogue) {
  const int64_t n = 64, k = 128;
  Matrix w(n, k, DType::f32, 1);
  const TensorView wv = w.view();
  const Linear layer(wv, nullptr, {});
  const size_t packed = layer.packed_bytes();
  for (int64_t m : {1, 2, 7, 64, 300}) {
    Matrix x(m, k, DType::f32, 2), out(m, n, DType::f32, 3);
    layer.forward(x.view(), &wv, out.view(), {PostOp::act(Activation::relu)});
    layer.forward(x.view(), nullptr, out.view(), {});
  }
  EXPECT_GE(packed, static_cast<size_t>(n * k) * sizeof(float));
  EXPECT_LE(layer.packed_bytes(), 2 * packed) << "layouts: more than two for one weight";
}

TEST(Linear, ThreadCountChangesNothingButSpeed) {
  const int64_t m = 48, n = 96, k = 256;
  Matrix x(m, k, DType::f32, 1), w(n, k, DType::f32, 2);
  const Linear layer(w.view(), nullptr, {});
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, saved}) {
    set_num_threads(threads);
    Matrix out(m, n, DType::f32, 3);
    layer.forward(x.view(), nullptr, out.view());
    results.push_back(out.f32);
  }
  set_num_threads(saved);
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < results[0].size(); ++i) ASSERT_NEAR(results[r][i], results[0][i], 1e-4);
  }
}

// fp32 on a weight in place from 9 to 256 rows, wider than tall, runs transposed (linear/linear_swapped.h): the
// bias through the product's starting value, the residual in the transposing pass, activations after it.
// Padded rows of x, w, out and residual; every placement of the add; row counts at both ends of the range and
// past it; a weight taller than wide, which stays on the plain path.
TEST(Linear, TransposedPathMatchesFloat64Reference) {
  const std::vector<Epilogue> epilogues = {{},
                                           {PostOp::act(Activation::gelu_erf)},
                                           {PostOp::add()},
                                           {PostOp::act(Activation::relu), PostOp::act(Activation::tanh)},
                                           {PostOp::act(Activation::silu), PostOp::add()},
                                           {PostOp::add(), PostOp::act(Activation::relu)},  // add first: plain
                                           {PostOp::act(Activation::gelu_tanh), PostOp::multiply()},
                                           {PostOp::multiply()}};
  uint32_t seed = 100;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{48, 300}, {70, 100}, {16, 20}, {100, 70}}) {
    Matrix w(n, k, DType::f32, seed++, /*pad=*/n == 70 ? 5 : 0);
    Matrix b_src(1, n, DType::f32, seed++);
    std::vector<float> bias(b_src.f32.begin(), b_src.f32.begin() + n);
    const TensorView bias_view(bias.data(), DType::f32, {n}), wv = w.view();
    for (bool with_bias : {true, false}) {
      const Linear layer(wv, with_bias ? &bias_view : nullptr, {DType::f32, false});
      for (int64_t m : {9, 33, 256, 257}) {
        for (const Epilogue& epilogue : epilogues) {
          Matrix x(m, k, DType::f32, seed++, /*pad=*/m % 2 ? 3 : 0);
          Matrix residual(m, n, DType::f32, seed++, /*pad=*/2);
          const Case c{DType::f32, DType::f32, epilogue, with_bias, false};
          check_forward(layer, c, x, w, bias, has_operand(epilogue) ? &residual : nullptr, seed++);
        }
        const bool transposed = m <= 256 && k > n;  // a small weight taller than wide takes the plain path
        EXPECT_EQ(layer.implementation(m, &wv).find("(swapped)") != std::string::npos, transposed) << "m " << m;
      }
    }
  }
}

TEST(Linear, TransposedPathIsIndependentOfTheThreadCount) {
  const int64_t m = 100, n = 96, k = 1000;
  Matrix x(m, k, DType::f32, 1), w(n, k, DType::f32, 2), residual(m, n, DType::f32, 3);
  std::vector<float> bias(n, 0.25f);
  const TensorView bias_view(bias.data(), DType::f32, {n}), wv = w.view(), rv = residual.view();
  const Linear layer(wv, &bias_view, {DType::f32, false});
  ASSERT_NE(layer.implementation(m, &wv).find("(swapped)"), std::string::npos);
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3, saved}) {
    set_num_threads(threads);
    Matrix out(m, n, DType::f32, 4);
    layer.forward(x.view(), &wv, out.view(), {PostOp::act(Activation::gelu_erf), PostOp::add()}, &rv);
    results.push_back(out.f32);
  }
  set_num_threads(saved);
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < results[0].size(); ++i) ASSERT_NEAR(results[r][i], results[0][i], 1e-4);
  }
}

// Several threads calling one layer at once with inputs of one shape share a cached primitive, whose argument set is
// kept between calls (onednn::BoundPrimitive): each call must read and write its own buffers. Every path: packed,
// in place, transposed (k > n), with a bias and a residual add.
TEST(Linear, ConcurrentCallsOfOnePrimitiveUseTheirOwnBuffers) {
  const int64_t m = 24;
  const int saved = num_threads();
  set_num_threads(1);  // the concurrency under test is the callers'
  for (auto [n, k, prepack] : {std::tuple<int64_t, int64_t, bool>{40, 64, true}, {40, 64, false}, {32, 96, false}}) {
    Matrix w(n, k, DType::f32, 1);
    std::vector<float> bias(static_cast<size_t>(n), 0.5f);
    const TensorView bias_view(bias.data(), DType::f32, {n}), wv = w.view();
    const Linear layer(wv, &bias_view, {DType::f32, prepack});
    const Epilogue epilogue{PostOp::act(Activation::relu), PostOp::add()};
    constexpr int kThreads = 4, kCalls = 40;
    std::vector<Matrix> xs, residuals;
    std::vector<std::vector<float>> expected;
    for (int t = 0; t < kThreads; ++t) {
      xs.emplace_back(m, k, DType::f32, 10 + t);
      residuals.emplace_back(m, n, DType::f32, 20 + t);
      Matrix out(m, n, DType::f32, 0);
      const TensorView rv = residuals[t].view();
      layer.forward(xs[t].view(), &wv, out.view(), epilogue, &rv);
      expected.push_back(out.f32);
    }
    const std::vector<int> mismatches = testing::failures_on_threads(kThreads, kCalls, [&](int t, int call) {
      Matrix out(m, n, DType::f32, 100 + call);
      const TensorView rv = residuals[t].view();
      layer.forward(xs[t].view(), &wv, out.view(), epilogue, &rv);
      return out.f32 == expected[t];
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t << ", n " << n << ", k " << k;
    EXPECT_EQ(layer.cached_primitives(), 1u);
  }
  set_num_threads(saved);
}

// oneDNN's JIT computes ReLU, ReLU6 and Hardsigmoid with max/min, which turn a NaN into 0 (or a bound); torch keeps
// it, and a diverged layer must not read as zeros. Rows holding NaN, +inf and -inf, a zero weight meeting the +inf
// (inf·0 = NaN) and a NaN in the residual go through every activation, alone, beside an add and in chains, on every
// path: the skinny kernel (2 rows on the caller's weight), the transposed matmul (24 rows of fp32 on a weight
// wider than tall), oneDNN on the caller's weight and prepacked.
// A bf16 output's leading erf GELU runs in oneDNN's primitive only where no sum can leave the finite floats
// (onednn::fuses_gelu): there oneDNN would give NaN for +inf. An input large enough to overflow a sum, and a layer
// with an infinite weight, keep ember's GELU(+inf) = +inf. 64 rows: oneDNN's matmul on every CPU (no tile or
// few-row kernel).
TEST(Linear, AGeluFusedIntoThePrimitiveNeverMeetsAnInfiniteSum) {
  if (!Linear::supported(DType::bf16)) GTEST_SKIP() << "no bf16 matmul on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t m = 64, n = 16, k = 32;
  for (Activation gelu : {Activation::gelu_erf, Activation::gelu_tanh}) {
    for (bool infinite_weight : {false, true}) {
      std::vector<float> weight(static_cast<size_t>(n * k), 0.0f), x(static_cast<size_t>(m * k), 0.0f);
      for (int64_t j = 0; j < n; ++j) weight[static_cast<size_t>(j * k + j)] = 1.0f;
      weight[static_cast<size_t>(0 * k + 1)] = 1.0f;  // out[:, 0] = x[:, 0] + x[:, 1]
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t p = 0; p < k; ++p) {
          x[static_cast<size_t>(i * k + p)] = 0.25f * static_cast<float>((i + p) % 8) - 0.5f;
        }
      }
      if (infinite_weight) {
        weight[static_cast<size_t>(2 * k + 2)] = inf;  // out[:, 2] = inf * x[:, 2]
        x[2] = 2.0f;
      } else {
        x[0] = x[1] = 3e38f;  // a sum of 6e38: +inf in float32
      }
      const Linear layer(TensorView(weight.data(), DType::f32, {n, k}), nullptr, {DType::bf16, true});
      std::vector<uint16_t> xb(x.size()), out(static_cast<size_t>(m * n));
      for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16::round_bits(bf16::float_bits(x[i]));
      layer.forward(TensorView(xb.data(), DType::bf16, {m, k}), nullptr, TensorView(out.data(), DType::bf16, {m, n}),
                    {PostOp::act(gelu)}, nullptr);
      const float got = bf16::widen(out[infinite_weight ? 2 : 0]);
      EXPECT_EQ(got, inf) << activation_name(gelu) << ": "
                          << (infinite_weight ? "an infinite weight" : "an overflowing sum") << " gave " << got;
      // The other rows are ordinary sums: the GELU of a small integer multiple of 0.25.
      for (int64_t i = 3; i < m; i += 7) {
        const float y = bf16::widen(out[static_cast<size_t>(i * n + 3)]);
        const double s = bf16::widen(xb[static_cast<size_t>(i * k + 3)]);
        const double u = std::sqrt(2.0 / M_PI) * (s + 0.044715 * s * s * s);
        const double want =
            gelu == Activation::gelu_erf ? 0.5 * s * std::erfc(-s / std::sqrt(2.0)) : s / (1.0 + std::exp(-2.0 * u));
        EXPECT_NEAR(y, want, 1e-2 * std::fabs(want) + 1e-6) << activation_name(gelu) << " of " << s;
      }
    }
  }
}

TEST(Linear, NonFiniteValuesPassThroughEveryActivationAsInTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<Epilogue> epilogues;
  for (Activation act : kAllActivations) epilogues.push_back({PostOp::act(act)});
  epilogues.push_back({PostOp::add(), PostOp::act(Activation::relu)});
  epilogues.push_back({PostOp::act(Activation::relu6), PostOp::add()});
  epilogues.push_back({PostOp::act(Activation::gelu_erf), PostOp::add(), PostOp::act(Activation::hardsigmoid),
                       PostOp::act(Activation::tanh)});
  const int64_t n = 32, k = 48;
  uint32_t seed = 500;
  for (DType compute : {DType::f32, DType::bf16}) {
    if (!Linear::supported(compute)) continue;
    Matrix w(n, k, compute, seed++);
    w.set(3, 1, 0.0f);
    std::vector<float> bias(n, 0.5f);
    const TensorView bias_view(bias.data(), DType::f32, {n}), wv = w.view();
    const double out_rel = compute == DType::bf16 ? 1.0 / 128 : 0.0;
    for (bool prepack : {false, true}) {
      const Linear layer(wv, &bias_view, {compute, prepack});
      for (int64_t m : {2, 24, 200}) {
        for (const Epilogue& epilogue : epilogues) {
          Matrix x(m, k, compute, seed++), residual(m, n, DType::f32, seed++), out(m, n, compute, seed++);
          x.set(0, 0, nan);
          x.set(1, 1, inf);
          x.set(m - 1, 2, -inf);
          residual.set(1, 5, nan);
          const TensorView rv = residual.view();
          layer.forward(x.view(), &wv, out.view(), epilogue, has_operand(epilogue) ? &rv : nullptr);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double want = bias[j], scale = std::fabs(bias[j]);
              for (int64_t p = 0; p < k; ++p) {
                want += x.at(i, p) * w.at(j, p);
                scale += std::fabs(x.at(i, p) * w.at(j, p));
              }
              const ChainReference chain = reference_chain(epilogue, want, residual.at(i, j));
              const double slack = compute == DType::bf16 ? chain.bf16_slack : 0.0;
              const double tol = 1e-5 * (scale + 8) + out_rel * std::fabs(chain.value) + slack + 1e-6;
              ASSERT_TRUE(testing::matches_reference(out.at(i, j), chain.value, tol))
                  << dtype_name(compute) << (prepack ? " packed" : " plain") << " m " << m << " ("
                  << layer.implementation(m, &wv) << ") epilogue of " << epilogue.size() << " starting "
                  << (epilogue[0].kind == PostOp::Kind::add ? "add" : activation_name(epilogue[0].activation))
                  << " at row " << i << " col " << j;
            }
          }
        }
      }
    }
  }
}

// An fp32 layer adding a bf16 residual (autocast's stream beside a layer kept in fp32), with the add alone and
// before an activation, packed and on the caller's weight, at the row counts of every fp32 route: the numbers of the
// float64 reference wherever oneDNN adds the residual and wherever ember's epilogue does (below AVX-512, where
// oneDNN 3.2 reads a bf16 post-op operand only in its reference matmul: onednn::primitive_reads).
TEST(Linear, Fp32LayerAddsABf16ResidualOnEveryRoute) {
  const int64_t n = 48, k = 40;
  Matrix w(n, k, DType::f32, 1);
  Matrix b_src(1, n, DType::f32, 2);
  std::vector<float> bias(b_src.f32.begin(), b_src.f32.begin() + n);
  const TensorView bias_view(bias.data(), DType::f32, {n});
  uint32_t seed = 30;
  for (bool prepack : {true, false}) {
    const Linear layer(w.view(), &bias_view, {DType::f32, prepack});
    for (const Epilogue& epilogue : {Epilogue{PostOp::add()}, Epilogue{PostOp::add(), PostOp::act(Activation::relu)}}) {
      const Case c{DType::f32, DType::f32, epilogue, true, prepack};
      for (int64_t m : {1, 7, 96}) {
        Matrix x(m, k, DType::f32, seed++), residual(m, n, DType::bf16, seed++, /*pad=*/2);
        check_forward(layer, c, x, w, bias, &residual, seed++);
      }
    }
  }
}

TEST(Linear, EmptyInputWritesNothing) {
  Matrix x(0, 8, DType::f32, 1), w(4, 8, DType::f32, 2), out(0, 4, DType::f32, 3);
  const Linear layer(w.view(), nullptr, {DType::f32, false});
  const TensorView wv = w.view();
  EXPECT_NO_THROW(layer.forward(x.view(), &wv, out.view()));
  EXPECT_EQ(layer.cached_primitives(), 0u);
}

TEST(Linear, RefusesBadArgumentsWithoutWriting) {
  const int64_t m = 4, n = 6, k = 8;
  Matrix x(m, k, DType::f32, 1), w(n, k, DType::f32, 2), out(m, n, DType::f32, 3), xb(m, k, DType::bf16, 4);
  Matrix residual(m, n, DType::f32, 5);
  const std::vector<float> before = out.f32;
  const TensorView wv = w.view();
  const Linear packed(wv, nullptr, {});
  const Linear plain(wv, nullptr, {DType::f32, false});
  Matrix wrong_k(m, k + 1, DType::f32, 6), wrong_w(n + 1, k, DType::f32, 7), out_bf16(m, n, DType::bf16, 8);
  const TensorView rv = residual.view(), wrong_wv = wrong_w.view();
  const Epilogue add{PostOp::add()};
  EXPECT_THROW(packed.forward(wrong_k.view(), &wv, out.view()), ValueError);
  EXPECT_THROW(packed.forward(x.view(), &wrong_wv, out.view()), ValueError);
  EXPECT_THROW(plain.forward(x.view(), nullptr, out.view()), ValueError);  // nothing packed to run on
  EXPECT_THROW(packed.forward(xb.view(), &wv, out.view()), TypeError);
  EXPECT_THROW(packed.forward(x.view(), &wv, out_bf16.view()), TypeError);  // f32 compute gives f32
  EXPECT_THROW(packed.forward(x.view(), &wv, out.view(), {}, &rv), ValueError);
  EXPECT_THROW(packed.forward(x.view(), &wv, out.view(), add), ValueError);
  EXPECT_THROW(packed.forward(x.view(), &wv, out.view(), {PostOp::add(), PostOp::add()}, &rv), ValueError);
  EXPECT_THROW(packed.forward(x.view(), &wv, x.view()), ValueError);  // shape, and it overlaps x
  const TensorView out_as_residual = out.view();
  EXPECT_THROW(packed.forward(x.view(), &wv, out.view(), add, &out_as_residual), ValueError);
  EXPECT_EQ(out.f32, before);

  Matrix empty(0, k, DType::f32, 9);
  EXPECT_THROW(Linear(empty.view(), nullptr, {}), ValueError);
  EXPECT_THROW(Linear(wv, nullptr, {DType::f64, true}), TypeError);
  EXPECT_THROW(Linear(wv, nullptr, {DType::f32, true, 0}), ValueError);
  std::vector<float> short_bias(n - 1);
  const TensorView bias_view(short_bias.data(), DType::f32, {n - 1});
  EXPECT_THROW(Linear(wv, &bias_view, {}), ValueError);
  if (Linear::supported(DType::bf16)) {
    EXPECT_THROW(Linear(wv, nullptr, {DType::bf16, false}), TypeError);  // unpacked needs a bf16 weight
  }
}

TEST(Linear, UnsupportedDtypeFailsClearly) {
  if (Linear::supported(DType::bf16)) GTEST_SKIP() << "this CPU has oneDNN's bf16 matmul";
  Matrix w(4, 8, DType::bf16, 2);
  EXPECT_THROW(Linear(w.view(), nullptr, {DType::bf16, true}), RuntimeError);
  EXPECT_TRUE(Linear::supported(DType::f32));
  EXPECT_FALSE(Linear::supported(DType::f16));
}

// float16 runs only where the CPU has AVX512-FP16; elsewhere construction says so.
TEST(Linear, Float16NeedsAvx512Fp16) {
  EXPECT_TRUE(cpu_features().avx512_fp16 || !Linear::supported(DType::f16));
  if (Linear::supported(DType::f16)) GTEST_SKIP() << "this CPU has oneDNN's native f16 matmul";
  Matrix w(4, 8, DType::f32, 2);
  EXPECT_THROW(Linear(w.view(), nullptr, {DType::f16, true}), RuntimeError);
}

TEST(Linear, ReportsItsImplementation) {
  Matrix w(64, 64, DType::f32, 1);
  const Linear layer(w.view(), nullptr, {DType::f32, true, 16});
  const std::string name = layer.implementation(16);
  EXPECT_FALSE(name.empty());
  EXPECT_EQ(layer.cached_primitives(), 1u);
}

}  // namespace
}  // namespace ember
