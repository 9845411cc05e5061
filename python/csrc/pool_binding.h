#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds max and average pooling (ember/pool.h) to the module.
void bind_pool(pybind11::module_& m);
}  // namespace ember::binding
