// SGD: argument checks, per-slot coefficients and the parallel pass over all slots of a group.
#include <string>

#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/optim.h"
#include "ember/trace.h"
#include "multi_tensor.h"
#include "optim_checks.h"
#include "optim_kernels.h"
#include "sgd_pass.h"
#include "storage_dispatch.h"

namespace ember::optim {
namespace {

using namespace kernels;
template <typename S>
constexpr IsaImpl<SgdFn<S>> kSgd[] = {{Isa::avx512, sgd_avx512<S>}, {Isa::avx2, sgd_avx2<S>}, {Isa::ref, sgd_ref<S>}};

constexpr int64_t kGrain = 1 << 15;

}  // namespace

void check_sgd_options(const SgdOptions& o) {
  constexpr std::string_view op = "SGD";
  check::finite_at_least(op, "lr", o.lr, 0.0);
  check::finite_at_least(op, "momentum", o.momentum, 0.0);
  EMBER_CHECK(std::isfinite(o.dampening), ValueError, op, ": dampening must be finite, got ", o.dampening);
  check::finite_at_least(op, "weight_decay", o.weight_decay, 0.0);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), ValueError, op,
              ": Nesterov momentum requires a momentum and zero dampening");
}

void sgd_step(const std::vector<SgdSlot>& slots, const SgdOptions& o, const AmpScalars& amp) {
  check_sgd_options(o);
  const bool with_momentum = o.momentum != 0.0;
  std::vector<detail::AnySgdSlot> any(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const SgdSlot& s = slots[i];
    EMBER_CHECK(s.numel == 0 || (s.param && s.grad && (!with_momentum || s.momentum_buffer)), ValueError, "SGD: slot ",
                i, " is missing a tensor");
    EMBER_CHECK(s.numel >= 0, ValueError, "SGD: slot ", i, " has numel ", s.numel);
    any[i] = {{s.param, nullptr, s.grad, StorageKind::fp32}, s.momentum_buffer, s.first_step, s.numel};
  }
  detail::sgd_step_with_trust(any, o, amp, {});
}

void detail::sgd_step_with_trust(const std::vector<AnySgdSlot>& slots, const SgdOptions& o, const AmpScalars& amp,
                                 const std::vector<float>& trust) {
  check_sgd_options(o);
  if (amp.found_inf != nullptr && *amp.found_inf != 0.0f) return;
  const bool with_momentum = o.momentum != 0.0;
  const auto kernels =
      select_storage_kernels<SgdFn>(kSgd<Fp32Storage>, kSgd<Bf16Storage>, kSgd<SplitStorage>, active_isa());
  std::vector<SgdCoeffs> coeffs(slots.size());
  std::vector<int64_t> numels(slots.size());
  int64_t total = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const AnySgdSlot& s = slots[i];
    SgdCoeffs& c = coeffs[i];
    c.scaled = amp.grad_scale != nullptr;
    c.grad_scale = c.scaled ? *amp.grad_scale : 1.0f;
    c.maximize = o.maximize;
    c.weight_decay = static_cast<float>(o.weight_decay);
    c.decays = o.weight_decay != 0.0;
    c.momentum = static_cast<float>(o.momentum);
    c.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
    c.neg_lr = static_cast<float>(-o.lr);
    c.nesterov = o.nesterov;
    c.first_step = s.first_step;
    c.trust = trust.empty() ? 1.0f : trust[i];
    numels[i] = s.numel;
    total += s.numel;
  }
  const KernelTrace trace("optim.sgd", kernels.isa,
                          [&] { return "tensors=" + std::to_string(slots.size()) + ",n=" + std::to_string(total); });
  for_each_segment(numels, kGrain, [&](size_t slot, int64_t begin, int64_t end) {
    const AnySgdSlot& s = slots[slot];
    with_storage(s.param.storage, [&](auto storage) {
      using S = decltype(storage);
      const auto t = s.param.pointers<SgdPointers, S>(with_momentum ? s.momentum_buffer : nullptr);
      kernels.template get<S>()(t, begin, end, coeffs[slot]);
    });
  });
}

AmpScalars detail::check_sgd_tensors(std::string_view op, const SgdTensors& t, bool with_momentum,
                                     const std::optional<TensorView>& grad_scale,
                                     const std::optional<TensorView>& found_inf, std::vector<AnySgdSlot>& slots) {
  const size_t n = t.params.size();
  check_list_length(op, "grads", t.grads.size(), n);
  check_list_length(op, "momentum_buffers", t.momentum_buffers.size(), with_momentum ? n : 0);
  check_list_length(op, "first_step", t.first_step.size(), with_momentum ? n : 0);
  check_bottoms_length(op, t.bottoms.size(), n);
  std::vector<check::ListItem> items;
  items.reserve(4 * n);
  slots.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    slots[i].param = check_param_slot(op, i, t.params, t.grads, t.bottoms, items);
    slots[i].numel = t.params[i].numel();
    if (with_momentum) {
      check_state_tensor(op, "momentum_buffers", i, t.momentum_buffers[i], t.params[i], items);
      slots[i].momentum_buffer = t.momentum_buffers[i].data_as<float>();
      slots[i].first_step = t.first_step[i];
    }
  }
  const AmpScalars amp = amp_scalars(op, grad_scale, found_inf, items);
  check::no_overlaps(op, items);
  return amp;
}

void sgd_step(const SgdTensors& t, const SgdOptions& o, const std::optional<TensorView>& grad_scale,
              const std::optional<TensorView>& found_inf) {
  check_sgd_options(o);
  std::vector<detail::AnySgdSlot> slots;
  const AmpScalars amp = detail::check_sgd_tensors("SGD", t, o.momentum != 0.0, grad_scale, found_inf, slots);
  detail::sgd_step_with_trust(slots, o, amp, {});
}

}  // namespace ember::optim
