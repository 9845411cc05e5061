// List arguments of the bindings: a Python sequence of DLPack objects as borrowed TensorViews, the DLPackArgs
// keeping the producers' memory alive for the call. Build and destroy them with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string_view>
#include <vector>

#include "dlpack_arg.h"

namespace ember::binding {

struct ViewList {
  std::vector<DLPackArg> args;
  std::vector<TensorView> views;
};

/// Every entry a tensor; messages name entry i "name[i]" of `op`.
ViewList to_views(const pybind11::sequence& seq, std::string_view op, std::string_view name);

/// A list whose entries may be None (a parameter that is not split, a table without per-sample weights).
struct OptionalViewList {
  std::vector<std::optional<DLPackArg>> args;
  std::vector<std::optional<TensorView>> views;
};

OptionalViewList to_optional_views(const pybind11::sequence& seq, std::string_view op, std::string_view name);

}  // namespace ember::binding
