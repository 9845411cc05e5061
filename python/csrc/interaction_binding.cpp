// ember._C bindings of the dot interaction: DLPack objects in, one core call with the GIL released.
#include "interaction_binding.h"

#include <string>
#include <string_view>
#include <vector>

#include "dlpack_arg.h"
#include "ember/interaction.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

constexpr std::string_view kOp = "interaction";

struct Views {
  std::vector<DLPackArg> args;
  std::vector<TensorView> views;
};

Views to_views(const py::sequence& seq, std::string_view name) {
  Views out;
  const auto n = static_cast<size_t>(seq.size());
  out.args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.args.emplace_back(seq[i].ptr(), kOp, name, static_cast<long>(i));
    out.views.push_back(out.args.back().view());
  }
  return out;
}

}  // namespace

void bind_interaction(py::module_& m) {
  m.def("interaction_implementation", []() { return std::string(isa_name(interaction::implementation())); });
  m.def("interaction_output_width", &interaction::output_width, py::arg("inputs"), py::arg("dim"));
  m.def(
      "interaction_forward",
      [](const py::sequence& inputs, py::handle out) {
        const Views in = to_views(inputs, "inputs");
        const DLPackArg o(out.ptr(), kOp, "out");
        py::gil_scoped_release release;
        interaction::forward(in.views, o.view());
      },
      py::arg("inputs"), py::arg("out"));
  m.def(
      "interaction_backward",
      [](const py::sequence& inputs, py::handle grad_out, const py::sequence& grad_inputs) {
        const Views in = to_views(inputs, "inputs");
        const DLPackArg g(grad_out.ptr(), kOp, "grad_out");
        const Views grads = to_views(grad_inputs, "grad_inputs");
        py::gil_scoped_release release;
        interaction::backward(in.views, g.view(), grads.views);
      },
      py::arg("inputs"), py::arg("grad_out"), py::arg("grad_inputs"));
}

}  // namespace ember::binding
