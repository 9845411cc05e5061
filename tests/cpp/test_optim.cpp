// Fused optimizer steps: multi-tensor partitioning, every ISA path against a double-precision reference of the
// documented formulas, thread-count independence, and argument checks that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/optim.h"
#include "ember/parallel.h"
#include "isa_test_util.h"
#include "optim/lamb_runs.h"
#include "optim/multi_tensor.h"

namespace ember {
namespace {

TEST(MultiTensor, EveryElementOnceOnAlignedPieces) {
  const std::vector<int64_t> numels = {0, 1, 63, 64, 65, 1000, 0, 77777, 5};
  for (int threads : {1, 2, 3, 7}) {
    const int saved = num_threads();
    set_num_threads(threads);
    std::vector<std::vector<std::atomic<int>>> hits;
    for (int64_t n : numels) hits.emplace_back(n);
    optim::detail::for_each_segment(numels, /*grain=*/100, [&](size_t slot, int64_t begin, int64_t end) {
      EXPECT_EQ(begin % optim::detail::kSegmentAlign, 0);
      EXPECT_LT(begin, end);
      for (int64_t i = begin; i < end; ++i) hits[slot][i]++;
    });
    for (size_t s = 0; s < numels.size(); ++s) {
      for (int64_t i = 0; i < numels[s]; ++i) ASSERT_EQ(hits[s][i].load(), 1) << "slot " << s << " index " << i;
    }
    set_num_threads(saved);
  }
}

TEST(MultiTensor, CacheRunsCoverEverySlotInOrderWithinTheBudget) {
  const std::vector<int64_t> numels = {10, 20, 30, 100, 5, 5, 0, 40};
  std::vector<std::pair<size_t, size_t>> runs;
  optim::detail::for_each_cache_run(numels, /*bytes_per_element=*/2, /*budget_bytes=*/100,
                                    [&](size_t first, size_t last) { runs.emplace_back(first, last); });
  // 20 + 40 + 60 bytes: the third slot starts a run; 200 alone is over budget and a run of its own.
  const std::vector<std::pair<size_t, size_t>> expected = {{0, 2}, {2, 3}, {3, 4}, {4, 8}};
  EXPECT_EQ(runs, expected);
  runs.clear();
  optim::detail::for_each_cache_run({}, 4, 100, [&](size_t first, size_t last) { runs.emplace_back(first, last); });
  EXPECT_TRUE(runs.empty());
}

struct AdamCase {
  std::vector<float> param, grad, m, v, vmax;
  float step = 0.0f;
};

AdamCase random_case(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  AdamCase c;
  for (int64_t i = 0; i < n; ++i) {
    c.param.push_back(normal(rng));
    c.grad.push_back(normal(rng));
    c.m.push_back(0.1f * normal(rng));
    c.v.push_back(std::fabs(0.1f * normal(rng)));
    c.vmax.push_back(c.v.back() * 1.5f);
  }
  c.step = 3.0f;
  return c;
}

// The formulas of ember/optim.h in double precision.
void adam_reference(AdamCase& c, const optim::AdamOptions& o) {
  const double step = c.step + 1.0;
  for (size_t i = 0; i < c.param.size(); ++i) {
    double p = c.param[i], g = o.maximize ? -c.grad[i] : c.grad[i];
    if (o.decoupled_weight_decay) {
      p *= 1.0 - o.lr * o.weight_decay;
    } else {
      g += o.weight_decay * p;
    }
    const double m = c.m[i] + (1.0 - o.beta1) * (g - c.m[i]);
    const double v = c.v[i] * o.beta2 + (1.0 - o.beta2) * g * g;
    double v_hat = v;
    if (o.amsgrad) {
      v_hat = std::max<double>(c.vmax[i], v);
      c.vmax[i] = static_cast<float>(v_hat);
    }
    const double denom = std::sqrt(v_hat) / std::sqrt(1.0 - std::pow(o.beta2, step)) + o.eps;
    p -= o.lr / (1.0 - std::pow(o.beta1, step)) * m / denom;
    c.param[i] = static_cast<float>(p);
    c.m[i] = static_cast<float>(m);
    c.v[i] = static_cast<float>(v);
  }
  c.step = static_cast<float>(step);
}

void run_adam(std::vector<AdamCase>& cases, const optim::AdamOptions& o) {
  std::vector<optim::AdamSlot> slots;
  for (AdamCase& c : cases) {
    slots.push_back({c.param.data(), c.grad.data(), c.m.data(), c.v.data(), c.vmax.data(), &c.step,
                     static_cast<int64_t>(c.param.size())});
  }
  optim::adam_step(slots, o);
}

class OptimPerIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(OptimPerIsa, AdamMatchesDoublePrecisionReference) {
  testing::ScopedIsaCap cap(GetParam());
  for (bool amsgrad : {false, true}) {
    for (bool decoupled : {false, true}) {
      optim::AdamOptions o;
      o.lr = 1e-2;
      o.weight_decay = 0.1;
      o.amsgrad = amsgrad;
      o.decoupled_weight_decay = decoupled;
      o.maximize = amsgrad;
      std::vector<AdamCase> ours = {random_case(1000, 1), random_case(17, 2), random_case(0, 3), random_case(4099, 4)};
      std::vector<AdamCase> reference = ours;
      run_adam(ours, o);
      for (AdamCase& c : reference) adam_reference(c, o);
      for (size_t s = 0; s < ours.size(); ++s) {
        EXPECT_EQ(ours[s].step, reference[s].step);
        for (size_t i = 0; i < ours[s].param.size(); ++i) {
          // A few float32 roundings of values of order 1.
          ASSERT_NEAR(ours[s].param[i], reference[s].param[i], 2e-6) << "slot " << s << " index " << i;
          ASSERT_NEAR(ours[s].m[i], reference[s].m[i], 1e-6);
          ASSERT_NEAR(ours[s].v[i], reference[s].v[i], 1e-6);
        }
      }
    }
  }
}

TEST_P(OptimPerIsa, AdamOnBf16ParametersRoundsOnceToNearestEven) {
  testing::ScopedIsaCap cap(GetParam());
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{4099}}) {
    AdamCase c = random_case(n, static_cast<uint32_t>(n + 100));
    std::vector<uint16_t> p16(static_cast<size_t>(n)), g16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      p16[i] = bf16::round_bits(bf16::float_bits(c.param[i]));
      g16[i] = bf16::round_bits(bf16::float_bits(c.grad[i]));
      c.param[i] = bf16::bits_float(uint32_t{p16[i]} << 16);  // the reference starts from the bf16 values
      c.grad[i] = bf16::bits_float(uint32_t{g16[i]} << 16);
    }
    AdamCase ref = c;
    optim::AdamOptions o;
    o.lr = 1e-2;
    auto f32 = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
    auto b16 = [](std::vector<uint16_t>& x) {
      return TensorView(x.data(), DType::bf16, {static_cast<int64_t>(x.size())});
    };
    optim::AdamTensors t{{b16(p16)}, {b16(g16)}, {f32(c.m)}, {f32(c.v)}, {}, {TensorView(&c.step, DType::f32, {})}};
    optim::adam_step(t, o, std::nullopt, std::nullopt);
    std::vector<AdamCase> refs = {ref};
    adam_reference(refs[0], o);
    for (int64_t i = 0; i < n; ++i) {
      const float ours = bf16::bits_float(uint32_t{p16[i]} << 16);
      const float expected = refs[0].param[i];
      ASSERT_LE(std::fabs(ours - expected), std::fabs(expected) * 0x1p-8f + 1e-30f) << "n " << n << " index " << i;
      ASSERT_NEAR(c.m[i], refs[0].m[i], 1e-6);  // the moments stay fp32
    }
  }
}

TEST_P(OptimPerIsa, SgdAndAdagradOnBf16Parameters) {
  testing::ScopedIsaCap cap(GetParam());
  const int64_t n = 1029;
  AdamCase c = random_case(n, 77);
  std::vector<uint16_t> p16(n), g16(n);
  for (int64_t i = 0; i < n; ++i) {
    p16[i] = bf16::round_bits(bf16::float_bits(c.param[i]));
    g16[i] = bf16::round_bits(bf16::float_bits(c.grad[i]));
  }
  auto f32 = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
  auto b16 = [](std::vector<uint16_t>& x) {
    return TensorView(x.data(), DType::bf16, {static_cast<int64_t>(x.size())});
  };
  auto widen = [](uint16_t h) { return static_cast<double>(bf16::bits_float(uint32_t{h} << 16)); };

  std::vector<uint16_t> sgd_p = p16;
  std::vector<float> buf(n, 0.0f);
  optim::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  optim::SgdTensors st{{b16(sgd_p)}, {b16(g16)}, {f32(buf)}, {true}};
  optim::sgd_step(st, so, std::nullopt, std::nullopt);

  std::vector<uint16_t> ada_p = p16;
  std::vector<float> sum(n, 0.1f);
  float step = 0.0f;
  optim::AdagradOptions ao;
  ao.lr = 0.1;
  optim::AdagradTensors at{{b16(ada_p)}, {b16(g16)}, {f32(sum)}, {TensorView(&step, DType::f32, {})}};
  optim::adagrad_step(at, ao, std::nullopt, std::nullopt);

  for (int64_t i = 0; i < n; ++i) {
    const double p = widen(p16[i]), g = widen(g16[i]);
    ASSERT_NEAR(buf[i], g, 1e-6);  // the first momentum step is the gradient, kept in fp32
    const double sgd = p - so.lr * g;
    ASSERT_LE(std::fabs(widen(sgd_p[i]) - sgd), std::fabs(sgd) * 0x1p-8 + 1e-6) << i;  // + float rounding near 0
    const double s = 0.1 + g * g;
    const double ada = p - ao.lr * g / (std::sqrt(s) + ao.eps);
    ASSERT_NEAR(sum[i], s, 1e-5 * s);
    ASSERT_LE(std::fabs(widen(ada_p[i]) - ada), std::fabs(ada) * 0x1p-8 + 1e-6) << i;
  }
  // A bf16 gradient for an fp32 parameter is refused by name.
  std::vector<float> p32(n, 0.0f);
  optim::SgdTensors mixed{{f32(p32)}, {b16(g16)}, {f32(buf)}, {false}};
  EXPECT_THROW(optim::sgd_step(mixed, so, std::nullopt, std::nullopt), TypeError);
}

TEST_P(OptimPerIsa, SgdMatchesDoublePrecisionReference) {
  testing::ScopedIsaCap cap(GetParam());
  optim::SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.dampening = 0.1;
  o.weight_decay = 1e-3;
  for (bool first : {true, false}) {
    AdamCase c = random_case(1031, 9);  // param, grad, and m as the momentum buffer
    AdamCase ref = c;
    std::vector<optim::SgdSlot> slots = {{c.param.data(), c.grad.data(), c.m.data(), first, 1031}};
    optim::sgd_step(slots, o);
    for (size_t i = 0; i < ref.param.size(); ++i) {
      const double g = ref.grad[i] + o.weight_decay * ref.param[i];
      const double buf = first ? g : ref.m[i] * o.momentum + (1.0 - o.dampening) * g;
      ASSERT_NEAR(c.m[i], buf, 1e-6);
      ASSERT_NEAR(c.param[i], ref.param[i] - o.lr * buf, 1e-6);
    }
  }
}

TEST_P(OptimPerIsa, AdagradMatchesDoublePrecisionReference) {
  testing::ScopedIsaCap cap(GetParam());
  optim::AdagradOptions o;
  o.lr = 0.05;
  o.lr_decay = 0.01;
  o.weight_decay = 0.1;
  AdamCase c = random_case(2053, 11);  // param, grad, and v as the running sum of squares
  AdamCase ref = c;
  float step = 4.0f;
  auto view = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
  optim::AdagradTensors t{{view(c.param)}, {view(c.grad)}, {view(c.v)}, {TensorView(&step, DType::f32, {})}};
  optim::adagrad_step(t, o, std::nullopt, std::nullopt);
  EXPECT_EQ(step, 5.0f);
  const double clr = o.lr / (1.0 + (5.0 - 1.0) * o.lr_decay);
  for (size_t i = 0; i < ref.param.size(); ++i) {
    const double g = ref.grad[i] + o.weight_decay * ref.param[i];
    const double sum = ref.v[i] + g * g;
    ASSERT_NEAR(c.v[i], sum, 1e-5 * std::max(1.0, sum));
    ASSERT_NEAR(c.param[i], ref.param[i] - clr * g / (std::sqrt(sum) + o.eps), 2e-6);
  }
}

// Lamb's first step on `ref` (step count 0) in double precision: the parameters it leaves (ember/optim.h's formula).
std::vector<double> lamb_reference(const AdamCase& ref, const optim::LambOptions& o) {
  std::vector<double> u(ref.param.size());
  double p_sq = 0, u_sq = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    const double g = ref.grad[i];
    const double m = ref.m[i] + (1 - o.beta1) * (g - ref.m[i]);
    const double v = ref.v[i] * o.beta2 + (1 - o.beta2) * g * g;
    u[i] = (m / (1 - o.beta1)) / (std::sqrt(v / (1 - o.beta2)) + o.eps) + o.weight_decay * ref.param[i];
    p_sq += static_cast<double>(ref.param[i]) * ref.param[i];
    u_sq += u[i] * u[i];
  }
  const double trust = std::sqrt(p_sq) / std::sqrt(u_sq);
  std::vector<double> expected(u.size());
  for (size_t i = 0; i < u.size(); ++i) expected[i] = ref.param[i] - o.lr * trust * u[i];
  return expected;
}

TEST_P(OptimPerIsa, LambAndLarsMatchDoublePrecisionReference) {
  testing::ScopedIsaCap cap(GetParam());
  auto view = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
  for (int64_t n : {int64_t{5}, int64_t{4096}, int64_t{3 * 4096 + 17}}) {
    AdamCase c = random_case(n, static_cast<uint32_t>(n));
    AdamCase ref = c;
    float step = 0.0f;
    optim::LambOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.01;
    optim::LambTensors t{
        {view(c.param)}, {view(c.grad)}, {view(c.m)}, {view(c.v)}, {TensorView(&step, DType::f32, {})}};
    optim::lamb_step(t, o, std::nullopt, std::nullopt);
    const std::vector<double> expected = lamb_reference(ref, o);
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(c.param[i], expected[i], 2e-5) << "n " << n << " index " << i;
    }
    EXPECT_EQ(c.grad, ref.grad) << "the gradient must not be written";

    AdamCase d = random_case(n, static_cast<uint32_t>(n + 1));
    AdamCase dref = d;
    optim::LarsOptions lo;
    lo.lr = 0.1;
    lo.weight_decay = 1e-4;
    optim::SgdTensors lt{{view(d.param)}, {view(d.grad)}, {view(d.m)}, {true}};
    optim::lars_step(lt, lo, std::nullopt, std::nullopt);
    double pp = 0, gg = 0;
    for (size_t i = 0; i < dref.param.size(); ++i) {
      pp += static_cast<double>(dref.param[i]) * dref.param[i];
      gg += static_cast<double>(dref.grad[i]) * dref.grad[i];
    }
    const double lars =
        lo.trust_coefficient * std::sqrt(pp) / (std::sqrt(gg) + lo.weight_decay * std::sqrt(pp) + lo.eps);
    for (size_t i = 0; i < dref.param.size(); ++i) {
      const double step_dir = (dref.grad[i] + lo.weight_decay * dref.param[i]) * lars;
      ASSERT_NEAR(d.m[i], step_dir, 1e-6);
      ASSERT_NEAR(d.param[i], dref.param[i] - lo.lr * step_dir, 1e-6);
    }
  }
}

// Lamb runs its two passes over runs of tensors that fit in the cache, keeping each element's direction between
// them; a tensor too large for a run is passed over twice, recomputing it (lamb.cpp). Each tensor's update depends
// on that tensor alone and the kept direction is the recomputed one, so every budget must give every tensor the
// same bits: each tensor alone recomputing (budget 0), runs of two keeping it, one run keeping all of it, at every
// ISA level.
TEST_P(OptimPerIsa, LambGivesTheSameBitsInAnyCacheRun) {
  testing::ScopedIsaCap cap(GetParam());
  auto view = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
  const std::vector<int64_t> sizes = {4096 * 3 + 17, 5, 64, 20000, 4096, 777};
  std::vector<AdamCase> start;
  for (size_t k = 0; k < sizes.size(); ++k) start.push_back(random_case(sizes[k], static_cast<uint32_t>(90 + k)));
  optim::LambOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  std::vector<std::vector<AdamCase>> results;
  for (int64_t budget : {int64_t{0}, int64_t{20} * (20000 + 4096), int64_t{1} << 40}) {
    std::vector<AdamCase> cases = start;
    std::vector<float> steps(cases.size(), 0.0f);
    optim::LambTensors t;
    for (size_t k = 0; k < cases.size(); ++k) {
      t.params.push_back(view(cases[k].param));
      t.grads.push_back(view(cases[k].grad));
      t.exp_avgs.push_back(view(cases[k].m));
      t.exp_avg_sqs.push_back(view(cases[k].v));
      t.steps.push_back(TensorView(&steps[k], DType::f32, {}));
    }
    optim::detail::lamb_step_in_runs(t, o, std::nullopt, std::nullopt, budget);
    results.push_back(std::move(cases));
  }
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_EQ(results[r][k].param, results[0][k].param) << "budget " << r << " tensor " << k;
      EXPECT_EQ(results[r][k].m, results[0][k].m) << "budget " << r << " tensor " << k;
      EXPECT_EQ(results[r][k].v, results[0][k].v) << "budget " << r << " tensor " << k;
    }
  }
  // And both are Lamb: the first tensor against the float64 formula.
  const std::vector<double> expected = lamb_reference(start[0], o);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(results[0][0].param[i], expected[i], 2e-5) << "index " << i;
  }
}

// A split-BF16 parameter is the fp32 value of its halves: stepping the halves must give the fp32 path's result
// bit for bit (same bf16-valued gradients), for every optimizer, at every length class (vectors and tails).
struct SplitCase {
  std::vector<float> param, grad, m, v;  // fp32 run
  std::vector<uint16_t> top, bottom, grad16;
  std::vector<float> split_m, split_v;  // split run
  float step = 0.0f, split_step = 0.0f;

  explicit SplitCase(int64_t n, uint32_t seed) {
    AdamCase c = random_case(n, seed);
    param = c.param;
    m = c.m;
    v = c.v;
    top.resize(static_cast<size_t>(n));
    bottom.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      grad16.push_back(bf16::round_bits(bf16::float_bits(c.grad[i])));
      grad.push_back(bf16::bits_float(uint32_t{grad16.back()} << 16));
    }
    bf16::split(param.data(), top.data(), bottom.data(), n);
    split_m = m;
    split_v = v;
  }
  int64_t n() const { return static_cast<int64_t>(param.size()); }
  TensorView f32(std::vector<float>& x) const { return TensorView(x.data(), DType::f32, {n()}); }
  TensorView b16(std::vector<uint16_t>& x) const { return TensorView(x.data(), DType::bf16, {n()}); }
  TensorView i16(std::vector<uint16_t>& x) const { return TensorView(x.data(), DType::i16, {n()}); }

  void expect_identical() const {
    std::vector<float> joined(param.size());
    bf16::join(top.data(), bottom.data(), joined.data(), n());
    for (size_t i = 0; i < param.size(); ++i) {
      ASSERT_EQ(bf16::float_bits(joined[i]), bf16::float_bits(param[i])) << "index " << i;
      ASSERT_EQ(bf16::float_bits(split_m[i]), bf16::float_bits(m[i])) << "index " << i;
      ASSERT_EQ(bf16::float_bits(split_v[i]), bf16::float_bits(v[i])) << "index " << i;
    }
  }
};

TEST_P(OptimPerIsa, SplitParametersStepExactlyLikeFp32) {
  testing::ScopedIsaCap cap(GetParam());
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{4099}, int64_t{70001}}) {
    SplitCase a(n, static_cast<uint32_t>(n)), b(n, static_cast<uint32_t>(n)), c(n, static_cast<uint32_t>(n)),
        d(n, static_cast<uint32_t>(n)), e(n, static_cast<uint32_t>(n));
    for (int repeat = 0; repeat < 3; ++repeat) {
      optim::AdamOptions ao;
      ao.lr = 1e-2;
      ao.weight_decay = 0.1;
      ao.decoupled_weight_decay = true;
      optim::adam_step(
          {{a.f32(a.param)}, {a.f32(a.grad)}, {a.f32(a.m)}, {a.f32(a.v)}, {}, {TensorView(&a.step, DType::f32, {})}},
          ao, std::nullopt, std::nullopt);
      optim::adam_step({{a.b16(a.top)},
                        {a.b16(a.grad16)},
                        {a.f32(a.split_m)},
                        {a.f32(a.split_v)},
                        {},
                        {TensorView(&a.split_step, DType::f32, {})},
                        {a.i16(a.bottom)}},
                       ao, std::nullopt, std::nullopt);

      optim::SgdOptions so;
      so.lr = 0.1;
      so.momentum = 0.9;
      so.weight_decay = 1e-3;
      optim::sgd_step({{b.f32(b.param)}, {b.f32(b.grad)}, {b.f32(b.m)}, {repeat == 0}}, so, std::nullopt, std::nullopt);
      optim::sgd_step({{b.b16(b.top)}, {b.b16(b.grad16)}, {b.f32(b.split_m)}, {repeat == 0}, {b.i16(b.bottom)}}, so,
                      std::nullopt, std::nullopt);

      optim::AdagradOptions gro;
      gro.lr = 0.1;
      gro.weight_decay = 0.1;
      optim::adagrad_step({{c.f32(c.param)}, {c.f32(c.grad)}, {c.f32(c.v)}, {TensorView(&c.step, DType::f32, {})}}, gro,
                          std::nullopt, std::nullopt);
      optim::adagrad_step({{c.b16(c.top)},
                           {c.b16(c.grad16)},
                           {c.f32(c.split_v)},
                           {TensorView(&c.split_step, DType::f32, {})},
                           {c.i16(c.bottom)}},
                          gro, std::nullopt, std::nullopt);

      optim::LambOptions lo;
      lo.lr = 1e-2;
      lo.weight_decay = 0.01;
      optim::lamb_step(
          {{d.f32(d.param)}, {d.f32(d.grad)}, {d.f32(d.m)}, {d.f32(d.v)}, {TensorView(&d.step, DType::f32, {})}}, lo,
          std::nullopt, std::nullopt);
      optim::lamb_step({{d.b16(d.top)},
                        {d.b16(d.grad16)},
                        {d.f32(d.split_m)},
                        {d.f32(d.split_v)},
                        {TensorView(&d.split_step, DType::f32, {})},
                        {d.i16(d.bottom)}},
                       lo, std::nullopt, std::nullopt);

      optim::LarsOptions la;
      la.lr = 0.1;
      la.weight_decay = 1e-4;
      optim::lars_step({{e.f32(e.param)}, {e.f32(e.grad)}, {e.f32(e.m)}, {repeat == 0}}, la, std::nullopt,
                       std::nullopt);
      optim::lars_step({{e.b16(e.top)}, {e.b16(e.grad16)}, {e.f32(e.split_m)}, {repeat == 0}, {e.i16(e.bottom)}}, la,
                       std::nullopt, std::nullopt);
    }
    for (const SplitCase* s : {&a, &b, &c, &d, &e}) s->expect_identical();
  }
}

INSTANTIATE_TEST_SUITE_P(AllSupported, OptimPerIsa, ::testing::ValuesIn(testing::supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(MultiTensor, BlocksCoverEveryElementInOrder) {
  const std::vector<int64_t> numels = {5000, 0, 4096, 1, 10000};
  for (int threads : {1, 3}) {
    const int saved = num_threads();
    set_num_threads(threads);
    std::vector<std::atomic<int>> seen(20000);
    std::vector<std::vector<std::atomic<int>>> hits;
    for (int64_t n : numels) hits.emplace_back(n);
    const auto first = optim::detail::for_each_block(numels, 1, [&](size_t slot, int64_t block, int64_t b, int64_t e) {
      EXPECT_EQ(b % optim::detail::kNormBlock, 0);
      seen[static_cast<size_t>(block)]++;
      for (int64_t i = b; i < e; ++i) hits[slot][i]++;
    });
    EXPECT_EQ(first, (std::vector<int64_t>{0, 2, 2, 3, 4, 7}));
    for (int64_t b = 0; b < first.back(); ++b) EXPECT_EQ(seen[static_cast<size_t>(b)].load(), 1);
    for (size_t s = 0; s < numels.size(); ++s) {
      for (int64_t i = 0; i < numels[s]; ++i) ASSERT_EQ(hits[s][i].load(), 1);
    }
    set_num_threads(saved);
  }
}

TEST(Optim, AdamIdenticalForAnyThreadCount) {
  optim::AdamOptions o;
  std::vector<AdamCase> first = {random_case(100000, 5), random_case(333, 6), random_case(70001, 7)};
  const int saved = num_threads();
  set_num_threads(1);
  std::vector<AdamCase> one = first;
  run_adam(one, o);
  for (int threads : {2, 3, 5}) {
    set_num_threads(threads);
    std::vector<AdamCase> many = first;
    run_adam(many, o);
    for (size_t s = 0; s < one.size(); ++s) EXPECT_EQ(many[s].param, one[s].param) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(Optim, FoundInfSkipsTheStep) {
  std::vector<AdamCase> cases = {random_case(100, 8)};
  const AdamCase before = cases[0];
  const float found_inf = 1.0f;
  std::vector<optim::AdamSlot> slots = {{cases[0].param.data(), cases[0].grad.data(), cases[0].m.data(),
                                         cases[0].v.data(), nullptr, &cases[0].step, 100}};
  optim::adam_step(slots, optim::AdamOptions{}, optim::AmpScalars{nullptr, &found_inf});
  EXPECT_EQ(cases[0].param, before.param);
  EXPECT_EQ(cases[0].step, before.step);
}

TEST(Optim, BadArgumentsWriteNothing) {
  std::vector<float> p(8, 1.0f), g(8, 1.0f), m(8, 0.0f), v(8, 0.0f), wrong(4, 0.0f);
  float step = 0.0f;
  auto view = [](std::vector<float>& x) { return TensorView(x.data(), DType::f32, {static_cast<int64_t>(x.size())}); };
  TensorView s(&step, DType::f32, {});
  optim::AdamTensors t{{view(p)}, {view(g)}, {view(m)}, {view(wrong)}, {}, {s}};
  EXPECT_THROW(optim::adam_step(t, optim::AdamOptions{}, std::nullopt, std::nullopt), ValueError);
  optim::AdamTensors aliased{{view(p)}, {view(g)}, {view(m)}, {view(p)}, {}, {s}};
  EXPECT_THROW(optim::adam_step(aliased, optim::AdamOptions{}, std::nullopt, std::nullopt), ValueError);
  optim::AdamOptions nan_lr;
  nan_lr.lr = std::nan("");
  optim::AdamTensors good{{view(p)}, {view(g)}, {view(m)}, {view(v)}, {}, {s}};
  EXPECT_THROW(optim::adam_step(good, nan_lr, std::nullopt, std::nullopt), ValueError);
  optim::SgdOptions bad_nesterov;
  bad_nesterov.nesterov = true;
  EXPECT_THROW(optim::check_sgd_options(bad_nesterov), ValueError);
  EXPECT_EQ(p, std::vector<float>(8, 1.0f));
  EXPECT_EQ(step, 0.0f);
  EXPECT_NO_THROW(optim::adam_step(good, optim::AdamOptions{}, std::nullopt, std::nullopt));
  EXPECT_EQ(step, 1.0f);
  EXPECT_NE(p[0], 1.0f);
}

TEST(Checks, NoOverlapsFindsTheSharingPair) {
  std::vector<float> buf(100);
  TensorView a(buf.data(), DType::f32, {10}), b(buf.data() + 10, DType::f32, {10});
  TensorView c(buf.data() + 5, DType::f32, {10}), far(buf.data() + 50, DType::f32, {10});
  EXPECT_NO_THROW(check::no_overlaps("op", {{"x", 0, &a, true}, {"x", 1, &b, true}}));
  // Read-only items may share with each other, never with a written one.
  EXPECT_NO_THROW(check::no_overlaps("op", {{"g", 0, &a, false}, {"g", 1, &c, false}, {"p", 0, &far, true}}));
  EXPECT_THROW(check::no_overlaps("op", {{"g", 0, &c, false}, {"p", 0, &b, true}}), ValueError);
  EXPECT_THROW(check::no_overlaps("op", {{"p", 0, &a, true}, {"g", 0, &c, false}}), ValueError);
  EXPECT_THROW(check::no_overlaps("op", {{"p", 0, &a, true}, {"p", 1, &c, true}}), ValueError);
}

}  // namespace
}  // namespace ember
