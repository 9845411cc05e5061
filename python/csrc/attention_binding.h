#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds scaled dot-product attention (ember/attention.h) to the module.
void bind_attention(pybind11::module_& m);
}  // namespace ember::binding
