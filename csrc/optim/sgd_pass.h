// The SGD update pass, shared by SGD (trust 1 for every slot) and LARS (a trust ratio per slot).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "ember/optim.h"
#include "storage_dispatch.h"

namespace ember::optim::detail {

/// One parameter of any storage with its momentum buffer (fp32; null without momentum).
struct AnySgdSlot {
  ParamSlot param;
  float* momentum_buffer = nullptr;
  bool first_step = false;
  int64_t numel = 0;
};

/// Checks the tensors of an SGD-style step (SGD, LARS) and grad_scale/found_inf, before anything is written, and
/// returns the slots in `slots`.
AmpScalars check_sgd_tensors(std::string_view op, const SgdTensors& tensors, bool with_momentum,
                             const std::optional<TensorView>& grad_scale, const std::optional<TensorView>& found_inf,
                             std::vector<AnySgdSlot>& slots);

/// The update pass: (g + weight_decay * p) is multiplied by trust[i] in slot i before momentum; empty trust: 1.
void sgd_step_with_trust(const std::vector<AnySgdSlot>& slots, const SgdOptions& options, const AmpScalars& amp,
                         const std::vector<float>& trust);

}  // namespace ember::optim::detail
