// The SGD update pass, shared by SGD (trust 1 for every slot) and LARS (a trust ratio per slot).
#pragma once

#include <vector>

#include "ember/optim.h"

namespace ember::optim::detail {
/// sgd_step with (g + weight_decay * p) multiplied by trust[i] in slot i before momentum; empty trust means 1.
void sgd_step_with_trust(const std::vector<SgdSlot>& slots, const SgdOptions& options, const AmpScalars& amp,
                         const std::vector<float>& trust);
}  // namespace ember::optim::detail
