// Adagrad: argument checks, per-slot coefficients and the parallel pass over all slots of a group.
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
constexpr IsaImpl<AdagradFn<S>> kAdagrad[] = {
    {Isa::avx512, adagrad_avx512<S>}, {Isa::avx2, adagrad_avx2<S>}, {Isa::ref, adagrad_ref<S>}};

constexpr int64_t kGrain = 1 << 15;

}  // namespace

void check_adagrad_options(const AdagradOptions& o) {
  constexpr std::string_view op = "Adagrad";
  check::finite_at_least(op, "lr", o.lr, 0.0);
  check::finite_at_least(op, "lr_decay", o.lr_decay, 0.0);
  check::finite_at_least(op, "weight_decay", o.weight_decay, 0.0);
  check::finite_at_least(op, "eps", o.eps, 0.0);
}

void adagrad_step(const AdagradTensors& t, const AdagradOptions& o, const std::optional<TensorView>& grad_scale,
                  const std::optional<TensorView>& found_inf) {
  constexpr std::string_view op = "Adagrad";
  check_adagrad_options(o);
  const size_t n = t.params.size();
  detail::check_list_length(op, "grads", t.grads.size(), n);
  detail::check_list_length(op, "state_sums", t.state_sums.size(), n);
  detail::check_list_length(op, "steps", t.steps.size(), n);
  detail::check_bottoms_length(op, t.bottoms.size(), n);
  std::vector<check::ListItem> items;
  items.reserve(5 * n);
  std::vector<detail::ParamSlot> slots(n);
  for (size_t i = 0; i < n; ++i) {
    slots[i] = detail::check_param_slot(op, i, t.params, t.grads, t.bottoms, items);
    detail::check_state_tensor(op, "state_sums", i, t.state_sums[i], t.params[i], items);
    detail::check_step_tensor(op, i, t.steps[i], items);
  }
  const AmpScalars amp = detail::amp_scalars(op, grad_scale, found_inf, items);
  check::no_overlaps(op, items);
  if (amp.found_inf != nullptr && *amp.found_inf != 0.0f) return;

  const auto kernels = detail::select_storage_kernels<AdagradFn>(kAdagrad<Fp32Storage>, kAdagrad<Bf16Storage>,
                                                                 kAdagrad<SplitStorage>, active_isa());
  std::vector<AdagradCoeffs> coeffs(n);
  std::vector<int64_t> numels(n);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    float& step = *t.steps[i].data_as<float>();
    step += 1.0f;
    AdagradCoeffs& c = coeffs[i];
    c.scaled = amp.grad_scale != nullptr;
    c.grad_scale = c.scaled ? *amp.grad_scale : 1.0f;
    c.maximize = o.maximize;
    c.weight_decay = static_cast<float>(o.weight_decay);
    c.decays = o.weight_decay != 0.0;
    c.eps = static_cast<float>(o.eps);
    c.neg_clr = static_cast<float>(-(o.lr / (1.0 + (static_cast<double>(step) - 1.0) * o.lr_decay)));
    numels[i] = t.params[i].numel();
    total += numels[i];
  }
  const KernelTrace trace("optim.adagrad", kernels.isa,
                          [&] { return "tensors=" + std::to_string(n) + ",n=" + std::to_string(total); });
  detail::for_each_segment(numels, kGrain, [&](size_t slot, int64_t begin, int64_t end) {
    detail::with_storage(slots[slot].storage, [&](auto storage) {
      using S = decltype(storage);
      const auto p = slots[slot].pointers<AdagradPointers, S>(t.state_sums[slot].data_as<float>());
      kernels.template get<S>()(p, begin, end, coeffs[slot]);
    });
  });
}

}  // namespace ember::optim
