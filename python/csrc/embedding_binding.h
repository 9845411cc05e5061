#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the merged embedding bag entry points (forward, backward, per-sample-weight gradient, fused SGD and
/// Adagrad updates) to the module.
void bind_embedding_bag(pybind11::module_& m);
}  // namespace ember::binding
