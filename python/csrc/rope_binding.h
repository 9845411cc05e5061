#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the rotary position embedding (ember/rope.h) to the module.
void bind_rope(pybind11::module_& m);
}  // namespace ember::binding
