#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Installs the translation of ember::TypeError/ValueError/IndexError/RuntimeError and dnnl::error.
void register_exception_translators();
}  // namespace ember::binding
