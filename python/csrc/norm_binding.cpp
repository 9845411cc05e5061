// ember._C bindings of the normalisations (fixed-statistics and row): DLPack objects in, one core call with the GIL
// released.
#include "norm_binding.h"

#include <string>

#include "dlpack_arg.h"
#include "ember/errors.h"
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
           const TensorArg& running_var, double eps, const TensorArg& out, bool relu) {
        const DLPackArg xa(x.ptr(), op, "x"), w(weight.ptr(), op, "weight"), b(bias.ptr(), op, "bias"),
            rm(running_mean.ptr(), op, "running_mean"), rv(running_var.ptr(), op, "running_var"),
            o(out.ptr(), op, "out");
        py::gil_scoped_release release;
        norm::frozen_batch_norm(xa, w, b, rm, rv, eps, o, relu);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("eps"),
      py::arg("out"), py::arg("relu") = false);
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
  m.def("row_norm_implementation", []() { return std::string(isa_name(norm::implementation())); });
  m.def(
      "row_norm",
      [](const std::string& kind, const TensorArg& x, const OptionalTensorArg& residual,
         const OptionalTensorArg& weight, const OptionalTensorArg& bias, double eps, const TensorArg& out,
         const OptionalTensorArg& sum_out, const OptionalTensorArg& out_bf16) {
        EMBER_CHECK(kind == "layer" || kind == "rms", ValueError, "row_norm: kind must be 'layer' or 'rms', got '",
                    kind, "'");
        const norm::RowNorm k = kind == "rms" ? norm::RowNorm::rms : norm::RowNorm::layer;
        const char* op = k == norm::RowNorm::rms ? "rms_norm" : "layer_norm";
        const DLPackArg xa(x.ptr(), op, "x"), oa(out.ptr(), op, "out");
        const auto ra = optional_arg(residual.ptr(), op, "residual"), wa = optional_arg(weight.ptr(), op, "weight"),
                   ba = optional_arg(bias.ptr(), op, "bias"), sa = optional_arg(sum_out.ptr(), op, "sum_out"),
                   la = optional_arg(out_bf16.ptr(), op, "out_bf16");
        py::gil_scoped_release release;
        norm::row_norm(k, xa, view_or_null(ra), view_or_null(wa), view_or_null(ba), eps, oa, view_or_null(sa),
                       view_or_null(la));
      },
      py::arg("kind"), py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
      py::arg("out"), py::arg("sum_out") = py::none(), py::arg("out_bf16") = py::none(),
      "out = norm(h) * weight + bias over the last dimension, h = x + residual (written to sum_out when given) or "
      "x; out_bf16, for a float32 out: the result rounded to bfloat16 too; kind 'layer' (LayerNorm) or 'rms' "
      "(RMSNorm, no bias). See ember/norm.h.");
}

}  // namespace ember::binding
