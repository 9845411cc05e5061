// ember._C bindings of the fixed-statistics normalisations: DLPack objects in, one core call with the GIL released.
#include "norm_binding.h"

#include <string>

#include "dlpack_arg.h"
#include "ember/norm.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_norm(py::module_& m) {
  constexpr const char* op = "frozen_batch_norm";
  m.def("frozen_batch_norm_implementation", []() { return std::string(isa_name(norm::implementation())); });
  m.def(
      "frozen_batch_norm",
      [op](const TensorArg& x, const TensorArg& weight, const TensorArg& bias, const TensorArg& running_mean,
           const TensorArg& running_var, double eps, const TensorArg& out) {
        const DLPackArg xa(x.ptr(), op, "x"), w(weight.ptr(), op, "weight"), b(bias.ptr(), op, "bias"),
            rm(running_mean.ptr(), op, "running_mean"), rv(running_var.ptr(), op, "running_var"),
            o(out.ptr(), op, "out");
        py::gil_scoped_release release;
        norm::frozen_batch_norm(xa, w, b, rm, rv, eps, o);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("eps"),
      py::arg("out"));
  m.def(
      "frozen_batch_norm_backward",
      [op](const TensorArg& grad_y, const TensorArg& weight, const TensorArg& running_var, double eps,
           const TensorArg& grad_x) {
        const DLPackArg g(grad_y.ptr(), op, "grad_y"), w(weight.ptr(), op, "weight"),
            rv(running_var.ptr(), op, "running_var"), o(grad_x.ptr(), op, "grad_x");
        py::gil_scoped_release release;
        norm::frozen_batch_norm_backward(g, w, rv, eps, o);
      },
      py::arg("grad_y"), py::arg("weight"), py::arg("running_var"), py::arg("eps"), py::arg("grad_x"));
}

}  // namespace ember::binding
