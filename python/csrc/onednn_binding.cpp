// ember._C bindings of the oneDNN layers. A layer object holds its primitives and reordered weights; python/ember
// owns it as a cache beside the torch module's parameters, which stay the source of truth.
#include "onednn_binding.h"

#include <pybind11/stl.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "dlpack_arg.h"
#include "ember/convolution.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "ember/linear.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

DType compute_dtype(const std::string& name, std::string_view op) {
  if (name == "float32") return DType::f32;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16") return DType::f16;
  throw TypeError(detail::concat(op, ": compute must be 'float32', 'bfloat16' or 'float16', got '", name, "'"));
}

// An activation's parameters as written after its name, "(0.2)" or "(-1, inf)": strtof's numbers ("inf" and
// "-inf" included), separated by commas.
std::vector<float> parse_parameters(const std::string& text, const std::string& entry, std::string_view op) {
  std::vector<float> values;
  const char* p = text.c_str();
  while (true) {
    char* end = nullptr;
    const float v = std::strtof(p, &end);
    EMBER_CHECK(end != p, ValueError, op, ": cannot read the parameters of epilogue entry '", entry, "'");
    values.push_back(v);
    while (*end == ' ') ++end;
    if (*end == '\0') return values;
    EMBER_CHECK(*end == ',', ValueError, op, ": cannot read the parameters of epilogue entry '", entry, "'");
    p = end + 1;
  }
}

// An epilogue entry: "add" or "mul" (of the call's residual tensor), an activation's name ("relu"), or an
// activation with its parameters ("elu(1.0)", "leaky_relu(0.01)", "clamp(0, 6)", "affine(2, 0.5)";
// ember/epilogue.h says what each means).
PostOp parse_post_op(const std::string& entry, std::string_view op) {
  if (entry == "add") return PostOp::add();
  if (entry == "mul") return PostOp::multiply();
  const size_t open = entry.find('(');
  const std::string name = entry.substr(0, open);
  std::vector<float> parameters;
  if (open != std::string::npos) {
    EMBER_CHECK(entry.size() > open + 1 && entry.back() == ')', ValueError, op, ": epilogue entry '", entry,
                "' has no closing parenthesis");
    parameters = parse_parameters(entry.substr(open + 1, entry.size() - open - 2), entry, op);
  }
  for (Activation act : kAllActivations) {
    if (name != activation_name(act)) continue;
    const int count = parameter_count(act);
    EMBER_CHECK(static_cast<int>(parameters.size()) == count, ValueError, op, ": ", name, " takes ", count,
                " parameter(s) in the epilogue, got '", entry, "'");
    parameters.resize(2, 0.0f);
    return PostOp::act(act, parameters[0], parameters[1]);
  }
  throw ValueError(
      detail::concat(op, ": epilogue entries must be relu, gelu, gelu_tanh, silu, sigmoid, tanh, ",
                     "hardswish, hardsigmoid, relu6, mish, elu(alpha), leaky_relu(slope), clamp(min, max), ",
                     "affine(scale, shift), add or mul, got '", entry, "'"));
}

}  // namespace

Epilogue parse_epilogue(const std::vector<std::string>& names, std::string_view op) {
  Epilogue epilogue;
  for (const std::string& name : names) epilogue.push_back(parse_post_op(name, op));
  return epilogue;  // the layers check its parameters on every call (check_epilogue)
}

// A [..., K] argument of a matmul as the [rows, K] matrix it is in memory, so callers pass a transformer's
// [batch, sequence, hidden] activations without reshaping them (two torch calls on every layer's hot path).
TensorView rows_of(const TensorView& t, std::string_view op, std::string_view arg) {
  const std::optional<TensorView> matrix = t.as_matrix();
  EMBER_CHECK(matrix.has_value(), ValueError, op, ": ", arg, " must be a [..., features] tensor whose leading ",
              "dimensions flatten into rows without a copy, got ", t.describe());
  return *matrix;
}

// out (and a residual) must have x's leading dimensions: flattened rows alone would let [2, 3, K] write [3, 2, N].
void check_same_leading(const TensorView& x, const TensorView& t, std::string_view op, std::string_view arg) {
  bool same = x.ndim() == t.ndim();
  for (int d = 0; same && d + 1 < x.ndim(); ++d) same = x.size(d) == t.size(d);
  EMBER_CHECK(same, ValueError, op, ": ", arg, " must have the leading dimensions of x ", x.describe(), ", got ",
              t.describe());
}

void bind_onednn(py::module_& m) {
  py::class_<Linear>(m, "Linear", "y = epilogue(x @ weight.T + bias) on oneDNN, with the weight reordered once")
      .def(py::init([](const TensorArg& weight, const OptionalTensorArg& bias, const std::string& compute, bool prepack,
                       int64_t rows_hint) {
             const DLPackArg w(weight.ptr(), "Linear", "weight");
             const auto b = optional_arg(bias.ptr(), "Linear", "bias");
             const Linear::Options options{compute_dtype(compute, "Linear"), prepack, rows_hint};
             py::gil_scoped_release release;
             return std::make_unique<Linear>(w, view_or_null(b), options);
           }),
           py::arg("weight"), py::arg("bias"), py::arg("compute"), py::arg("prepack") = true, py::arg("rows_hint") = 64)
      .def_static(
          "supported", [](const std::string& compute) { return Linear::supported(compute_dtype(compute, "Linear")); },
          py::arg("compute"))
      .def_static(
          "skinny_rows",
          [](const std::string& compute) { return Linear::skinny_rows(compute_dtype(compute, "Linear")); },
          py::arg("compute"),
          "Inputs of at most this many rows on a weight in place run on ember's skinny matmul (32 for bf16 where "
          "AMX runs, 8 otherwise, under the current ISA cap).")
      .def_static(
          "route",
          [](const std::string& compute, int64_t rows, const TensorArg& weight, bool in_place, bool caller_mkl_fp32) {
            const DLPackArg w(weight.ptr(), "Linear.route", "weight");
            return std::string(
                kernel_name(Linear::route(compute_dtype(compute, "Linear.route"), rows, w, in_place, caller_mkl_fp32)));
          },
          py::arg("compute"), py::arg("rows"), py::arg("weight"), py::arg("in_place"), py::arg("caller_mkl_fp32"),
          "Which kernel serves calls of `rows` rows on `weight` ([out_features, in_features] as the caller holds "
          "it; only its shape and strides are read): 'caller' where the caller's own matmul (torch's) is the "
          "faster one, else 'skinny', 'tiles', 'few_rows', 'swapped' or 'onednn'. `in_place`: the layer runs on that "
          "weight where it lies; `caller_mkl_fp32`: the caller's fp32 matmul is MKL's on an Intel CPU.")
      .def(
          "forward",
          [](const Linear& self, const TensorArg& x, const OptionalTensorArg& weight, const TensorArg& out,
             const std::vector<std::string>& epilogue, const OptionalTensorArg& residual,
             const std::optional<std::string>& kernel) {
            std::optional<LinearKernel> chosen;
            if (kernel) {
              EMBER_CHECK(*kernel == "onednn" || *kernel == "tiles" || *kernel == "few_rows", ValueError,
                          "Linear.forward: kernel must be None, 'onednn', 'tiles' or 'few_rows', got '", *kernel, "'");
              chosen = *kernel == "tiles"      ? LinearKernel::tiles
                       : *kernel == "few_rows" ? LinearKernel::few_rows
                                               : LinearKernel::onednn;
            }
            const DLPackArg xa(x.ptr(), "Linear", "x"), oa(out.ptr(), "Linear", "out");
            const auto wa = optional_arg(weight.ptr(), "Linear", "weight");
            const auto ra = optional_arg(residual.ptr(), "Linear", "residual");
            const Epilogue ops = parse_epilogue(epilogue, "Linear");
            check_same_leading(xa, oa, "Linear", "out");
            if (ra) check_same_leading(xa, *ra, "Linear", "residual");
            const TensorView x_rows = rows_of(xa, "Linear", "x"), out_rows = rows_of(oa, "Linear", "out");
            std::optional<TensorView> residual_rows;
            if (ra) residual_rows = rows_of(*ra, "Linear", "residual");
            py::gil_scoped_release release;
            const TensorView* res = residual_rows ? &*residual_rows : nullptr;
            if (chosen) {
              self.forward_on(*chosen, x_rows, view_or_null(wa), out_rows, ops, res);
            } else {
              self.forward(x_rows, view_or_null(wa), out_rows, ops, res);
            }
          },
          py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("epilogue") = std::vector<std::string>{},
          py::arg("residual") = py::none(), py::arg("kernel") = py::none(),
          "out = epilogue(x @ weight.T + bias) for x [..., in_features] (an 'add' or 'mul' entry reads residual); out "
          "and residual [..., out_features] of x's leading dimensions, read as rows where they lie (no reshape "
          "needed). `kernel`: None for the router's choice, or 'onednn' / 'tiles' / 'few_rows' to run that kernel "
          "(tests and benchmarks comparing kernels; 'tiles' needs AMX and a prepacked bfloat16 layer, 'few_rows' "
          "AVX512-BF16, such a layer and at most 4 rows)")
      .def_property_readonly("out_features", &Linear::out_features)
      .def_property_readonly("in_features", &Linear::in_features)
      .def_property_readonly("compute",
                             [](const Linear& self) { return std::string(dtype_name(self.options().compute)); })
      .def_property_readonly("prepack", [](const Linear& self) { return self.options().prepack; })
      .def("packed_bytes", &Linear::packed_bytes)
      .def("cached_primitives", &Linear::cached_primitives)
      .def(
          "implementation",
          [](const Linear& self, int64_t m, const OptionalTensorArg& weight) {
            const auto wa = optional_arg(weight.ptr(), "Linear.implementation", "weight");
            py::gil_scoped_release release;
            return self.implementation(m, view_or_null(wa));
          },
          py::arg("m"), py::arg("weight") = py::none());

  py::class_<Convolution>(m, "Convolution",
                          "y = epilogue(conv(x, weight) + bias) on oneDNN (transposed too), weight reordered once")
      .def(py::init([](const TensorArg& weight, const OptionalTensorArg& bias, std::vector<int64_t> stride,
                       std::vector<int64_t> padding_l, std::vector<int64_t> padding_r, std::vector<int64_t> dilation,
                       int64_t groups, bool transposed, const std::string& compute, const TensorArg& input_hint) {
             const DLPackArg w(weight.ptr(), "Convolution", "weight");
             const DLPackArg hint(input_hint.ptr(), "Convolution", "input_hint");
             const auto b = optional_arg(bias.ptr(), "Convolution", "bias");
             Convolution::Geometry geometry{
                 std::move(stride), std::move(padding_l), std::move(padding_r), std::move(dilation), groups,
                 transposed};
             const Convolution::Options options{compute_dtype(compute, "Convolution")};
             py::gil_scoped_release release;
             return std::make_unique<Convolution>(w, view_or_null(b), std::move(geometry), options, hint);
           }),
           py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding_l"), py::arg("padding_r"),
           py::arg("dilation"), py::arg("groups"), py::arg("transposed"), py::arg("compute"), py::arg("input_hint"))
      .def_static(
          "supported",
          [](const std::string& compute) { return Convolution::supported(compute_dtype(compute, "Convolution")); },
          py::arg("compute"))
      .def(
          "forward",
          [](const Convolution& self, const TensorArg& x, const TensorArg& out,
             const std::vector<std::string>& epilogue, const OptionalTensorArg& residual) {
            const DLPackArg xa(x.ptr(), "Convolution", "x"), oa(out.ptr(), "Convolution", "out");
            const auto ra = optional_arg(residual.ptr(), "Convolution", "residual");
            const Epilogue ops = parse_epilogue(epilogue, "Convolution");
            py::gil_scoped_release release;
            self.forward(xa, oa, ops, view_or_null(ra));
          },
          py::arg("x"), py::arg("out"), py::arg("epilogue") = std::vector<std::string>{},
          py::arg("residual") = py::none())
      .def("output_shape", &Convolution::output_shape, py::arg("input_shape"))
      .def_property_readonly("in_channels", &Convolution::in_channels)
      .def_property_readonly("out_channels", &Convolution::out_channels)
      .def_property_readonly("compute",
                             [](const Convolution& self) { return std::string(dtype_name(self.options().compute)); })
      .def("packed_bytes", &Convolution::packed_bytes)
      .def("cached_primitives", &Convolution::cached_primitives)
      .def(
          "implementation",
          [](const Convolution& self, const TensorArg& x) {
            const DLPackArg xa(x.ptr(), "Convolution.implementation", "x");
            py::gil_scoped_release release;
            return self.implementation(xa);
          },
          py::arg("x"));
}

}  // namespace ember::binding
