#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds the paged key/value cache (ember/kv_cache.h) and the attention over it to the module.
void bind_kv_cache(pybind11::module_& m);
}  // namespace ember::binding
