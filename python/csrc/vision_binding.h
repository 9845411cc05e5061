#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the detection ops (nms, roi_align) to the module.
void bind_vision(pybind11::module_& m);
}  // namespace ember::binding
