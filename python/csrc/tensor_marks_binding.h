#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds TensorMarks, the check of every fused layer's tensors a graph-mode forward makes at its start
/// (tensor_marks_binding.cpp), to the module.
void bind_tensor_marks(pybind11::module_& m);
}  // namespace ember::binding
