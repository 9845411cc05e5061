#include "view_lists.h"

namespace py = pybind11;

namespace ember::binding {

ViewList to_views(const py::sequence& seq, std::string_view op, std::string_view name) {
  ViewList out;
  const auto n = static_cast<size_t>(seq.size());
  out.args.reserve(n);
  out.views.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.args.emplace_back(seq[i].ptr(), op, name, static_cast<long>(i));
    out.views.push_back(out.args.back().view());
  }
  return out;
}

OptionalViewList to_optional_views(const py::sequence& seq, std::string_view op, std::string_view name) {
  OptionalViewList out;
  const auto n = static_cast<size_t>(seq.size());
  out.args.reserve(n);
  out.views.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const py::object item = seq[i];
    if (item.is_none()) {
      out.args.emplace_back();
      out.views.emplace_back();
    } else {
      const DLPackArg& arg = out.args.emplace_back().emplace(item.ptr(), op, name, static_cast<long>(i));
      out.views.emplace_back(arg.view());
    }
  }
  return out;
}

}  // namespace ember::binding
