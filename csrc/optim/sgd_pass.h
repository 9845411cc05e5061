// The SGD update pass, shared by SGD (trust 1 for every slot) and LARS (a trust ratio per slot).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "ember/optim.h"

namespace ember::optim::detail {
/// sgd_step with (g + weight_decay * p) multiplied by trust[i] in slot i before momentum; empty trust means 1.
/// Checks the tensors of an SGD-style step (SGD, LARS) and grad_scale/found_inf, before anything is written.
/// With allow_bf16, parameters (and their gradients) may be bfloat16; momentum buffers are float32 always.
AmpScalars check_sgd_tensors(std::string_view op, const SgdTensors& tensors, bool with_momentum, bool allow_bf16,
                             const std::optional<TensorView>& grad_scale, const std::optional<TensorView>& found_inf);

/// One parameter of either dtype with its momentum buffer (fp32).
struct AnySgdSlot {
  void* param;
  const void* grad;
  float* momentum_buffer;
  bool first_step;
  int64_t numel;
  bool bf16;
};

/// The update pass: (g + weight_decay * p) is multiplied by trust[i] in slot i before momentum; empty trust: 1.
void sgd_step_with_trust(const std::vector<AnySgdSlot>& slots, const SgdOptions& options, const AmpScalars& amp,
                         const std::vector<float>& trust);
}  // namespace ember::optim::detail
