#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the dot interaction's forward and backward to the module.
void bind_interaction(pybind11::module_& m);
}  // namespace ember::binding
