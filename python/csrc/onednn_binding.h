#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <vector>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::binding {
/// Adds the oneDNN layers (Linear, Convolution) to the module.
void bind_onednn(pybind11::module_& m);

/// An epilogue as the layers' forward takes it: entries "relu", "elu(1.0)", "add", ... (ember/epilogue.h).
Epilogue parse_epilogue(const std::vector<std::string>& names, std::string_view op);
/// A [..., K] argument of a matmul as the [rows, K] matrix it is in memory (ValueError where no view is one).
TensorView rows_of(const TensorView& t, std::string_view op, std::string_view arg);
/// ValueError unless `t` has the leading dimensions of x (out and a residual of a Linear).
void check_same_leading(const TensorView& x, const TensorView& t, std::string_view op, std::string_view arg);
}  // namespace ember::binding
