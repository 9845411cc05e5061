#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds frozen batch norm's forward and backward to the module.
void bind_norm(pybind11::module_& m);
}  // namespace ember::binding
