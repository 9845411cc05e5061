#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the elementwise product of two tensors (ember/epilogue.h: multiply) to the module.
void bind_elementwise(pybind11::module_& m);
}  // namespace ember::binding
