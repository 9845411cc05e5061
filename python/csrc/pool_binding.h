#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>

#include "ember/pool.h"

namespace ember::binding {
/// Adds max and average pooling (ember/pool.h) to the module.
void bind_pool(pybind11::module_& m);

/// A window from (height, width) pairs as Python passes them (the pooling functions and the replay's pool steps).
pool::Window2d pool_window(const std::array<int64_t, 2>& kernel, const std::array<int64_t, 2>& stride,
                           const std::array<int64_t, 2>& padding, const std::array<int64_t, 2>& dilation,
                           bool ceil_mode);
}  // namespace ember::binding
