// ember._C bindings of the dot interaction: DLPack objects in, one core call with the GIL released.
#include "interaction_binding.h"

#include <string>
#include <string_view>
#include <vector>

#include "dlpack_arg.h"
#include "ember/interaction.h"
#include "tensor_args.h"
#include "view_lists.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

constexpr std::string_view kOp = "interaction";

}  // namespace

void bind_interaction(py::module_& m) {
  m.def("interaction_implementation", []() { return std::string(isa_name(interaction::implementation())); });
  m.def("interaction_output_width", &interaction::output_width, py::arg("inputs"), py::arg("dim"));
  m.def(
      "interaction_forward",
      [](const TensorListArg& inputs, const TensorArg& out) {
        const ViewList in = to_views(inputs, kOp, "inputs");
        const DLPackArg o(out.ptr(), kOp, "out");
        py::gil_scoped_release release;
        interaction::forward(in.views, o.view());
      },
      py::arg("inputs"), py::arg("out"));
  m.def(
      "interaction_backward",
      [](const TensorListArg& inputs, const TensorArg& grad_out, const TensorListArg& grad_inputs) {
        const ViewList in = to_views(inputs, kOp, "inputs");
        const DLPackArg g(grad_out.ptr(), kOp, "grad_out");
        const ViewList grads = to_views(grad_inputs, kOp, "grad_inputs");
        py::gil_scoped_release release;
        interaction::backward(in.views, g.view(), grads.views);
      },
      py::arg("inputs"), py::arg("grad_out"), py::arg("grad_inputs"));
}

}  // namespace ember::binding
