// Binding a core options struct (optim::AdamOptions, ...) to Python once: each field is named in one place, and
// becomes a typed attribute and a keyword of the constructor, with the core's default.
//   bind_options<optim::AdamOptions>(m, "AdamOptions", "doc", field("lr", &optim::AdamOptions::lr), ...);
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace ember::binding {

template <typename T, typename M>
struct Field {
  const char* name;
  M T::* member;
};

template <typename T, typename M>
Field<T, M> field(const char* name, M T::* member) {
  return {name, member};
}

template <typename T, typename... M>
pybind11::class_<T> bind_options(pybind11::module_& m, const char* name, const char* doc, Field<T, M>... fields) {
  namespace py = pybind11;
  py::class_<T> cls(m, name, doc);
  const T defaults{};
  // Keywords only, each defaulting to the core's default: ``AdamOptions(lr=1e-3, beta1=0.9)``.
  cls.def(py::init([fields...](M... values) {
            T options;
            ((options.*(fields.member) = values), ...);
            return options;
          }),
          py::kw_only(), (py::arg(fields.name) = defaults.*(fields.member))...);
  (cls.def_readwrite(fields.name, fields.member), ...);
  cls.def("__repr__", [name, fields...](const T& options) {
    std::string text = std::string(name) + "(";
    const char* separator = "";
    const auto append = [&](const auto& f) {
      text +=
          separator + std::string(f.name) + "=" + py::repr(py::cast(options.*(f.member))).template cast<std::string>();
      separator = ", ";
    };
    (append(fields), ...);
    return text + ")";
  });
  return cls;
}

}  // namespace ember::binding
