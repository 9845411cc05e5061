// Lamb and LARS: the optimizers whose update needs per-tensor norms. Each runs a reduction pass over fixed-size
// blocks (multi_tensor.h: identical results for any thread count), combines the block sums per tensor in block
// order, computes the per-tensor trust ratio in double, then runs the elementwise update pass. Lamb runs both
// passes over runs of tensors that fit in the last-level cache, so its second pass reads from the cache.
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/optim.h"
#include "ember/streaming.h"
#include "ember/trace.h"
#include "lamb_runs.h"
#include "multi_tensor.h"
#include "optim_checks.h"
#include "optim_kernels.h"
#include "sgd_pass.h"
#include "storage_dispatch.h"

namespace ember::optim {
namespace {

using namespace kernels;
template <typename S>
constexpr IsaImpl<LambMomentsFn<S>> kLambMoments[] = {
    {Isa::avx512, lamb_moments_avx512<S>}, {Isa::avx2, lamb_moments_avx2<S>}, {Isa::ref, lamb_moments_ref<S>}};
template <typename S>
constexpr IsaImpl<LambApplyFn<S>> kLambApply[] = {
    {Isa::avx512, lamb_apply_avx512<S>}, {Isa::avx2, lamb_apply_avx2<S>}, {Isa::ref, lamb_apply_ref<S>}};
template <typename S>
constexpr IsaImpl<SumSquaresFn<S>> kSumSquares[] = {
    {Isa::avx512, sum_squares_avx512<S>}, {Isa::avx2, sum_squares_avx2<S>}, {Isa::ref, sum_squares_ref<S>}};

constexpr int64_t kGrainBlocks = 4;  // 16K elements
constexpr int64_t kGrain = 1 << 15;

// Per-slot sums of the two block sums, added in block order.
void sum_blocks(const std::vector<int64_t>& first, const std::vector<double>& a, const std::vector<double>& b,
                std::vector<double>& sum_a, std::vector<double>& sum_b) {
  const size_t slots = first.size() - 1;
  sum_a.assign(slots, 0.0);
  sum_b.assign(slots, 0.0);
  for (size_t s = 0; s < slots; ++s) {
    for (int64_t k = first[s]; k < first[s + 1]; ++k) {
      sum_a[s] += a[static_cast<size_t>(k)];
      sum_b[s] += b[static_cast<size_t>(k)];
    }
  }
}

template <typename S>
LambPointers<S> lamb_pointers(const detail::ParamSlot& param, const LambTensors& t, size_t i) {
  return param.pointers<LambPointers, S>(t.exp_avgs[i].data_as<float>(), t.exp_avg_sqs[i].data_as<float>());
}

// What a run of the Lamb passes holds in cache per element (fp32 p, g, m and v, and the kept direction u; less for
// bf16 parameters).
constexpr int64_t kLambBytesPerElement = 20;

// The direction u of a run's tensors, end to end: kept between calls (it only grows) by the calling thread, so a
// step allocates nothing once the first has run. At most the run budget's fifth (30 MiB with the Xeon's 300 MiB
// cache, 3.2 MiB with 32 MiB).
float* direction_scratch(int64_t elements) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < elements) scratch.resize(static_cast<size_t>(elements));
  return scratch.data();
}

size_t block_count(const std::vector<int64_t>& numels) {
  size_t blocks = 0;
  for (int64_t n : numels) blocks += static_cast<size_t>((n + detail::kNormBlock - 1) / detail::kNormBlock);
  return blocks;
}

}  // namespace

void check_lamb_options(const LambOptions& o) {
  constexpr std::string_view op = "Lamb";
  check::finite_at_least(op, "lr", o.lr, 0.0);
  check::finite_at_least(op, "eps", o.eps, 0.0);
  check::finite_at_least(op, "weight_decay", o.weight_decay, 0.0);
  detail::check_unit_interval(op, "betas[0]", o.beta1);
  detail::check_unit_interval(op, "betas[1]", o.beta2);
}

void detail::lamb_step_in_runs(const LambTensors& t, const LambOptions& o, const std::optional<TensorView>& grad_scale,
                               const std::optional<TensorView>& found_inf, int64_t run_budget_bytes) {
  constexpr std::string_view op = "Lamb";
  check_lamb_options(o);
  const size_t n = t.params.size();
  detail::check_list_length(op, "grads", t.grads.size(), n);
  detail::check_list_length(op, "exp_avgs", t.exp_avgs.size(), n);
  detail::check_list_length(op, "exp_avg_sqs", t.exp_avg_sqs.size(), n);
  detail::check_list_length(op, "steps", t.steps.size(), n);
  detail::check_bottoms_length(op, t.bottoms.size(), n);
  std::vector<check::ListItem> items;
  items.reserve(6 * n);
  std::vector<detail::ParamSlot> slots(n);
  for (size_t i = 0; i < n; ++i) {
    slots[i] = detail::check_param_slot(op, i, t.params, t.grads, t.bottoms, items);
    detail::check_state_tensor(op, "exp_avgs", i, t.exp_avgs[i], t.params[i], items);
    detail::check_state_tensor(op, "exp_avg_sqs", i, t.exp_avg_sqs[i], t.params[i], items);
    detail::check_step_tensor(op, i, t.steps[i], items);
  }
  const AmpScalars amp = detail::amp_scalars(op, grad_scale, found_inf, items);
  check::no_overlaps(op, items);
  if (amp.found_inf != nullptr && *amp.found_inf != 0.0f) return;

  const Isa level = active_isa();
  const auto moments = detail::select_storage_kernels<LambMomentsFn>(
      kLambMoments<Fp32Storage>, kLambMoments<Bf16Storage>, kLambMoments<SplitStorage>, level);
  const auto apply = detail::select_storage_kernels<LambApplyFn>(kLambApply<Fp32Storage>, kLambApply<Bf16Storage>,
                                                                 kLambApply<SplitStorage>, level);
  std::vector<LambCoeffs> coeffs(n);
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    float& step = *t.steps[i].data_as<float>();
    step += 1.0f;
    LambCoeffs& c = coeffs[i];
    c.scaled = amp.grad_scale != nullptr;
    c.grad_scale = c.scaled ? *amp.grad_scale : 1.0f;
    c.maximize = o.maximize;
    c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    c.beta2 = static_cast<float>(o.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    c.inv_bias_correction1 = o.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(o.beta1, step))) : 1.0f;
    c.inv_bias_correction2 = o.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(o.beta2, step))) : 1.0f;
    c.eps = static_cast<float>(o.eps);
    c.weight_decay = static_cast<float>(o.weight_decay);
    c.decays = o.weight_decay != 0.0;
    numels[i] = t.params[i].numel();
  }
  const KernelTrace trace("optim.lamb", moments.isa, [&] { return "tensors=" + std::to_string(n); });

  // Both passes run over one run of tensors before the next, each run sized to stay in the cache: the first pass
  // keeps each element's direction u, and the second reads p and u where the first left them, so memory sees what
  // Adam's one pass moves (28 bytes an fp32 parameter) and u's division and square root are computed once. A
  // tensor too large for a run of its own is passed over twice from memory, the second pass recomputing u from the
  // updated m and v (40 bytes). Neither changes a result: u is the same value either way, and a tensor's blocks,
  // and the order its block sums are added in, are the same in any run.
  detail::for_each_cache_run(numels, kLambBytesPerElement, run_budget_bytes, [&](size_t first, size_t last) {
    const std::vector<int64_t> run(numels.begin() + static_cast<std::ptrdiff_t>(first),
                                   numels.begin() + static_cast<std::ptrdiff_t>(last));
    std::vector<int64_t> offset(run.size() + 1, 0);  // where each tensor's u starts in the scratch
    for (size_t k = 0; k < run.size(); ++k) offset[k + 1] = offset[k] + run[k];
    float* const kept =
        offset.back() * kLambBytesPerElement <= run_budget_bytes ? direction_scratch(offset.back()) : nullptr;
    const auto pointers = [&](auto storage, size_t k) {
      using S = decltype(storage);
      LambPointers<S> p = lamb_pointers<S>(slots[first + k], t, first + k);
      if (kept != nullptr) p.direction = kept + offset[k];
      return p;
    };
    std::vector<double> block_p(block_count(run)), block_u(block_p.size());
    const std::vector<int64_t> blocks =
        detail::for_each_block(run, kGrainBlocks, [&](size_t k, int64_t block, int64_t begin, int64_t end) {
          const size_t slot = first + k;
          detail::with_storage(slots[slot].storage, [&](auto storage) {
            using S = decltype(storage);
            moments.template get<S>()(pointers(storage, k), begin, end, coeffs[slot],
                                      &block_p[static_cast<size_t>(block)], &block_u[static_cast<size_t>(block)]);
          });
        });
    std::vector<double> p_sq, u_sq;
    sum_blocks(blocks, block_p, block_u, p_sq, u_sq);
    for (size_t k = 0; k < run.size(); ++k) {
      const double p_norm = std::sqrt(p_sq[k]), u_norm = std::sqrt(u_sq[k]);
      const double trust = p_norm > 0.0 && u_norm > 0.0 ? p_norm / u_norm : 1.0;
      coeffs[first + k].neg_lr_trust = static_cast<float>(-o.lr * trust);
    }
    detail::for_each_segment(run, kGrain, [&](size_t k, int64_t begin, int64_t end) {
      const size_t slot = first + k;
      detail::with_storage(slots[slot].storage, [&](auto storage) {
        using S = decltype(storage);
        apply.template get<S>()(pointers(storage, k), begin, end, coeffs[slot]);
      });
    });
  });
}

void lamb_step(const LambTensors& t, const LambOptions& o, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf) {
  // Runs fill at most half the last-level cache, leaving room for what else the machine keeps there.
  detail::lamb_step_in_runs(t, o, grad_scale, found_inf, last_level_cache_bytes() / 2);
}

void check_lars_options(const LarsOptions& o) {
  constexpr std::string_view op = "LARS";
  check::finite_at_least(op, "lr", o.lr, 0.0);
  check::finite_at_least(op, "momentum", o.momentum, 0.0);
  EMBER_CHECK(std::isfinite(o.dampening), ValueError, op, ": dampening must be finite, got ", o.dampening);
  check::finite_at_least(op, "weight_decay", o.weight_decay, 0.0);
  check::finite_at_least(op, "trust_coefficient", o.trust_coefficient, 0.0);
  check::finite_at_least(op, "eps", o.eps, 0.0);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), ValueError, op,
              ": Nesterov momentum requires a momentum and zero dampening");
}

void lars_step(const SgdTensors& t, const LarsOptions& o, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf) {
  check_lars_options(o);
  const size_t n = t.params.size();
  const bool with_momentum = o.momentum != 0.0;
  std::vector<detail::AnySgdSlot> slots;
  const AmpScalars amp = detail::check_sgd_tensors("LARS", t, with_momentum, grad_scale, found_inf, slots);
  if (amp.found_inf != nullptr && *amp.found_inf != 0.0f) return;

  const auto sum_squares = detail::select_storage_kernels<SumSquaresFn>(
      kSumSquares<Fp32Storage>, kSumSquares<Bf16Storage>, kSumSquares<SplitStorage>, active_isa());
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) numels[i] = slots[i].numel;
  std::vector<double> block_p(block_count(numels)), block_g(block_p.size());
  const std::vector<int64_t> first =
      detail::for_each_block(numels, kGrainBlocks, [&](size_t slot, int64_t block, int64_t begin, int64_t end) {
        const detail::ParamSlot& p = slots[slot].param;
        detail::with_storage(p.storage, [&](auto storage) {
          using S = decltype(storage);
          sum_squares.template get<S>()(p.pointers<NormPointers, S>(), begin, end, &block_p[static_cast<size_t>(block)],
                                        &block_g[static_cast<size_t>(block)]);
        });
      });
  std::vector<double> p_sq, g_sq;
  sum_blocks(first, block_p, block_g, p_sq, g_sq);

  const double scale = amp.grad_scale != nullptr ? static_cast<double>(*amp.grad_scale) : 1.0;
  std::vector<float> trust(n);
  for (size_t i = 0; i < n; ++i) {
    const double p_norm = std::sqrt(p_sq[i]), g_norm = std::sqrt(g_sq[i]) / scale;
    trust[i] = p_norm > 0.0 && g_norm > 0.0
                   ? static_cast<float>(o.trust_coefficient * p_norm / (g_norm + o.weight_decay * p_norm + o.eps))
                   : 1.0f;
  }
  SgdOptions sgd;
  sgd.lr = o.lr;
  sgd.momentum = o.momentum;
  sgd.dampening = o.dampening;
  sgd.weight_decay = o.weight_decay;
  sgd.nesterov = o.nesterov;
  sgd.maximize = o.maximize;
  detail::sgd_step_with_trust(slots, sgd, amp, trust);
}

}  // namespace ember::optim
