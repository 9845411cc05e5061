#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds adam_step and sgd_step to the module.
void bind_optim(pybind11::module_& m);
}  // namespace ember::binding
