#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the oneDNN layers (Linear) to the module.
void bind_onednn(pybind11::module_& m);
}  // namespace ember::binding
