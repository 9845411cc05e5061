// Lamb's step with the size of its cache runs given (lamb.cpp): lamb_step uses half the last-level cache; tests
// choose others, so that one machine runs every case (every tensor alone and recomputing its direction, runs of
// several tensors keeping it) whatever its cache.
#pragma once

#include <cstdint>
#include <optional>

#include "ember/optim.h"
#include "ember/tensor_view.h"

namespace ember::optim::detail {

/// lamb_step, both passes over runs of consecutive tensors whose elements hold at most `run_budget_bytes` (20 B an
/// element: p, g, m, v and the kept direction); a tensor larger than that is passed over twice from memory.
void lamb_step_in_runs(const LambTensors& t, const LambOptions& o, const std::optional<TensorView>& grad_scale,
                       const std::optional<TensorView>& found_inf, int64_t run_budget_bytes);

}  // namespace ember::optim::detail
