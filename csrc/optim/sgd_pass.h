// The SGD update pass, shared by SGD (trust 1 for every slot) and LARS (a trust ratio per slot).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "ember/optim.h"

namespace ember::optim::detail {
/// sgd_step with (g + weight_decay * p) multiplied by trust[i] in slot i before momentum; empty trust means 1.
/// Checks the tensors of an SGD-style step (SGD, LARS) and grad_scale/found_inf, before anything is written.
AmpScalars check_sgd_tensors(std::string_view op, const SgdTensors& tensors, bool with_momentum,
                             const std::optional<TensorView>& grad_scale, const std::optional<TensorView>& found_inf);

void sgd_step_with_trust(const std::vector<SgdSlot>& slots, const SgdOptions& options, const AmpScalars& amp,
                         const std::vector<float>& trust);
}  // namespace ember::optim::detail
