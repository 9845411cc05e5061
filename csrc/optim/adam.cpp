// Adam/AdamW: argument checks, per-slot coefficients and the parallel pass over all slots of a group.
#include <cmath>
#include <string>

#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/optim.h"
#include "ember/trace.h"
#include "multi_tensor.h"
#include "optim_checks.h"
#include "optim_kernels.h"
#include "storage_dispatch.h"

namespace ember::optim {
namespace {

using namespace kernels;
template <typename S>
constexpr IsaImpl<AdamFn<S>> kAdam[] = {
    {Isa::avx512, adam_avx512<S>}, {Isa::avx2, adam_avx2<S>}, {Isa::ref, adam_ref<S>}};

// Below ~16K elements (~450 KB moved) a fork/join costs more than a second core saves.
constexpr int64_t kGrain = 1 << 14;

}  // namespace

void check_adam_options(const AdamOptions& o) {
  constexpr std::string_view op = "Adam";
  check::finite_at_least(op, "lr", o.lr, 0.0);
  check::finite_at_least(op, "eps", o.eps, 0.0);
  check::finite_at_least(op, "weight_decay", o.weight_decay, 0.0);
  detail::check_unit_interval(op, "betas[0]", o.beta1);
  detail::check_unit_interval(op, "betas[1]", o.beta2);
}

namespace {

// One parameter of any storage, with its state: what both entry points reduce to.
struct AnySlot {
  detail::ParamSlot param;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  float* step = nullptr;
  int64_t numel = 0;
};

void run_adam(const std::vector<AnySlot>& slots, const AdamOptions& o, const AmpScalars& amp) {
  if (amp.found_inf != nullptr && *amp.found_inf != 0.0f) return;  // the scaler found inf/NaN: skip the step
  const auto kernels =
      detail::select_storage_kernels<AdamFn>(kAdam<Fp32Storage>, kAdam<Bf16Storage>, kAdam<SplitStorage>, active_isa());
  std::vector<AdamCoeffs> coeffs(slots.size());
  std::vector<int64_t> numels(slots.size());
  int64_t total = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const AnySlot& s = slots[i];
    *s.step += 1.0f;  // torch keeps the count in a float32 tensor and reads it back as a double
    const double step = *s.step;
    AdamCoeffs& c = coeffs[i];
    c.scaled = amp.grad_scale != nullptr;
    c.inv_grad_scale_denominator = c.scaled ? *amp.grad_scale : 1.0f;
    c.maximize = o.maximize;
    c.decoupled = o.decoupled_weight_decay && o.weight_decay != 0.0;
    c.decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);
    c.weight_decay = o.decoupled_weight_decay ? 0.0f : static_cast<float>(o.weight_decay);
    c.decays = !o.decoupled_weight_decay && o.weight_decay != 0.0;
    c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    c.beta2 = static_cast<float>(o.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    c.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step)));
    c.eps = static_cast<float>(o.eps);
    c.neg_step_size = static_cast<float>(-(o.lr / (1.0 - std::pow(o.beta1, step))));
    c.amsgrad = o.amsgrad;
    numels[i] = s.numel;
    total += s.numel;
  }
  const KernelTrace trace("optim.adam", kernels.isa,
                          [&] { return "tensors=" + std::to_string(slots.size()) + ",n=" + std::to_string(total); });
  detail::for_each_segment(numels, kGrain, [&](size_t slot, int64_t begin, int64_t end) {
    const AnySlot& s = slots[slot];
    detail::with_storage(s.param.storage, [&](auto storage) {
      using S = decltype(storage);
      const auto t = s.param.pointers<AdamPointers, S>(s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq);
      kernels.template get<S>()(t, begin, end, coeffs[slot]);
    });
  });
}

}  // namespace

void adam_step(const std::vector<AdamSlot>& slots, const AdamOptions& o, const AmpScalars& amp) {
  check_adam_options(o);
  std::vector<AnySlot> any(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdamSlot& s = slots[i];
    // Empty tensors may have no storage at all; only the step count must always be there.
    EMBER_CHECK(s.step != nullptr && (s.numel == 0 || (s.param && s.grad && s.exp_avg && s.exp_avg_sq &&
                                                       (!o.amsgrad || s.max_exp_avg_sq))),
                ValueError, "Adam: slot ", i, " is missing a tensor");
    EMBER_CHECK(s.numel >= 0, ValueError, "Adam: slot ", i, " has numel ", s.numel);
    any[i] = {
        {s.param, nullptr, s.grad, StorageKind::fp32}, s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq, s.step, s.numel};
  }
  run_adam(any, o, amp);
}

void adam_step(const AdamTensors& t, const AdamOptions& o, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf) {
  constexpr std::string_view op = "Adam";
  check_adam_options(o);
  const size_t n = t.params.size();
  detail::check_list_length(op, "grads", t.grads.size(), n);
  detail::check_list_length(op, "exp_avgs", t.exp_avgs.size(), n);
  detail::check_list_length(op, "exp_avg_sqs", t.exp_avg_sqs.size(), n);
  detail::check_list_length(op, "max_exp_avg_sqs", t.max_exp_avg_sqs.size(), o.amsgrad ? n : 0);
  detail::check_list_length(op, "steps", t.steps.size(), n);
  detail::check_bottoms_length(op, t.bottoms.size(), n);
  std::vector<check::ListItem> items;
  items.reserve(7 * n);
  std::vector<AnySlot> slots(n);
  for (size_t i = 0; i < n; ++i) {
    const detail::ParamSlot param = detail::check_param_slot(op, i, t.params, t.grads, t.bottoms, items);
    detail::check_state_tensor(op, "exp_avgs", i, t.exp_avgs[i], t.params[i], items);
    detail::check_state_tensor(op, "exp_avg_sqs", i, t.exp_avg_sqs[i], t.params[i], items);
    if (o.amsgrad) detail::check_state_tensor(op, "max_exp_avg_sqs", i, t.max_exp_avg_sqs[i], t.params[i], items);
    detail::check_step_tensor(op, i, t.steps[i], items);
    slots[i] = {param,
                t.exp_avgs[i].data_as<float>(),
                t.exp_avg_sqs[i].data_as<float>(),
                o.amsgrad ? t.max_exp_avg_sqs[i].data_as<float>() : nullptr,
                t.steps[i].data_as<float>(),
                t.params[i].numel()};
  }
  const AmpScalars amp = detail::amp_scalars(op, grad_scale, found_inf, items);
  check::no_overlaps(op, items);
  run_adam(slots, o, amp);
}

}  // namespace ember::optim
