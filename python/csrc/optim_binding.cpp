// ember._C bindings of the fused optimizer steps: lists of DLPack objects and one options object in, one core call,
// GIL released. Each optimizer's hyper-parameters are its options struct (ember/optim.h), bound once below.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string_view>
#include <vector>

#include "dlpack_arg.h"
#include "ember/optim.h"
#include "optim_binding.h"
#include "options_binding.h"
#include "tensor_args.h"
#include "view_lists.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

struct OptionalView {
  std::optional<DLPackArg> arg;
  std::optional<TensorView> view;
};

OptionalView to_optional_view(const OptionalTensorArg& obj, std::string_view op, std::string_view name) {
  OptionalView out;
  if (!obj.is_none()) {
    out.arg.emplace(obj.ptr(), op, name);
    out.view = out.arg->view();
  }
  return out;
}

// What every step takes besides its lists: the AMP scalars and the split-BF16 bottom halves.
struct StepExtras {
  OptionalView grad_scale, found_inf;
  OptionalViewList bottoms;
};

StepExtras to_step_extras(const OptionalTensorArg& grad_scale, const OptionalTensorArg& found_inf,
                          const OptionalTensorListArg& bottoms, std::string_view op) {
  return {to_optional_view(grad_scale, op, "grad_scale"), to_optional_view(found_inf, op, "found_inf"),
          to_optional_views(bottoms, op, "bottoms")};
}

// The arguments every step ends with: the AMP scalars and the split-BF16 bottom halves.
auto step_extras() {
  namespace py = pybind11;
  return std::make_tuple(py::arg("grad_scale") = py::none(), py::arg("found_inf") = py::none(),
                         py::arg("bottoms") = py::tuple());
}

}  // namespace

void bind_optim(py::module_& m) {
  using optim::AdagradOptions, optim::AdamOptions, optim::LambOptions, optim::LarsOptions, optim::SgdOptions;
  bind_options(m, "AdamOptions", "Adam's and AdamW's hyper-parameters (ember/optim.h)", field("lr", &AdamOptions::lr),
               field("beta1", &AdamOptions::beta1), field("beta2", &AdamOptions::beta2),
               field("eps", &AdamOptions::eps), field("weight_decay", &AdamOptions::weight_decay),
               field("decoupled_weight_decay", &AdamOptions::decoupled_weight_decay),
               field("amsgrad", &AdamOptions::amsgrad), field("maximize", &AdamOptions::maximize));
  bind_options(m, "AdagradOptions", "Adagrad's hyper-parameters", field("lr", &AdagradOptions::lr),
               field("lr_decay", &AdagradOptions::lr_decay), field("weight_decay", &AdagradOptions::weight_decay),
               field("eps", &AdagradOptions::eps), field("maximize", &AdagradOptions::maximize));
  bind_options(m, "LambOptions", "Lamb's hyper-parameters", field("lr", &LambOptions::lr),
               field("beta1", &LambOptions::beta1), field("beta2", &LambOptions::beta2),
               field("eps", &LambOptions::eps), field("weight_decay", &LambOptions::weight_decay),
               field("bias_correction", &LambOptions::bias_correction), field("maximize", &LambOptions::maximize));
  bind_options(m, "SgdOptions", "SGD's hyper-parameters", field("lr", &SgdOptions::lr),
               field("momentum", &SgdOptions::momentum), field("dampening", &SgdOptions::dampening),
               field("weight_decay", &SgdOptions::weight_decay), field("nesterov", &SgdOptions::nesterov),
               field("maximize", &SgdOptions::maximize));
  bind_options(m, "LarsOptions", "LARS's hyper-parameters", field("lr", &LarsOptions::lr),
               field("momentum", &LarsOptions::momentum), field("dampening", &LarsOptions::dampening),
               field("weight_decay", &LarsOptions::weight_decay),
               field("trust_coefficient", &LarsOptions::trust_coefficient), field("eps", &LarsOptions::eps),
               field("nesterov", &LarsOptions::nesterov), field("maximize", &LarsOptions::maximize));
  const auto [grad_scale, found_inf, bottoms] = step_extras();

  m.def(
      "adam_step",
      [](const TensorListArg& params, const TensorListArg& grads, const TensorListArg& exp_avgs,
         const TensorListArg& exp_avg_sqs, const TensorListArg& max_exp_avg_sqs, const TensorListArg& steps,
         const AdamOptions& options, const OptionalTensorArg& grad_scale, const OptionalTensorArg& found_inf,
         const OptionalTensorListArg& bottoms) {
        constexpr std::string_view op = "Adam";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       m1 = to_views(exp_avgs, op, "exp_avgs"), m2 = to_views(exp_avg_sqs, op, "exp_avg_sqs"),
                       mx = to_views(max_exp_avg_sqs, op, "max_exp_avg_sqs"), s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        const optim::AdamTensors tensors{p.views, g.views, m1.views, m2.views, mx.views, s.views, x.bottoms.views};
        py::gil_scoped_release release;
        optim::adam_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("max_exp_avg_sqs"),
      py::arg("steps"), py::arg("options"), py::kw_only(), grad_scale, found_inf, bottoms);

  m.def(
      "adagrad_step",
      [](const TensorListArg& params, const TensorListArg& grads, const TensorListArg& state_sums,
         const TensorListArg& steps, const AdagradOptions& options, const OptionalTensorArg& grad_scale,
         const OptionalTensorArg& found_inf, const OptionalTensorListArg& bottoms) {
        constexpr std::string_view op = "Adagrad";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       sums = to_views(state_sums, op, "state_sums"), s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        const optim::AdagradTensors tensors{p.views, g.views, sums.views, s.views, x.bottoms.views};
        py::gil_scoped_release release;
        optim::adagrad_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("state_sums"), py::arg("steps"), py::arg("options"), py::kw_only(),
      grad_scale, found_inf, bottoms);

  m.def(
      "lamb_step",
      [](const TensorListArg& params, const TensorListArg& grads, const TensorListArg& exp_avgs,
         const TensorListArg& exp_avg_sqs, const TensorListArg& steps, const LambOptions& options,
         const OptionalTensorArg& grad_scale, const OptionalTensorArg& found_inf,
         const OptionalTensorListArg& bottoms) {
        constexpr std::string_view op = "Lamb";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       m1 = to_views(exp_avgs, op, "exp_avgs"), m2 = to_views(exp_avg_sqs, op, "exp_avg_sqs"),
                       s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        const optim::LambTensors tensors{p.views, g.views, m1.views, m2.views, s.views, x.bottoms.views};
        py::gil_scoped_release release;
        optim::lamb_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("steps"),
      py::arg("options"), py::kw_only(), grad_scale, found_inf, bottoms);

  m.def(
      "lars_step",
      [](const TensorListArg& params, const TensorListArg& grads, const TensorListArg& momentum_buffers,
         const std::vector<bool>& first_step, const LarsOptions& options, const OptionalTensorArg& grad_scale,
         const OptionalTensorArg& found_inf, const OptionalTensorListArg& bottoms) {
        constexpr std::string_view op = "LARS";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       b = to_views(momentum_buffers, op, "momentum_buffers");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        const optim::SgdTensors tensors{p.views, g.views, b.views, first_step, x.bottoms.views};
        py::gil_scoped_release release;
        optim::lars_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("first_step"), py::arg("options"),
      py::kw_only(), grad_scale, found_inf, bottoms);

  m.def(
      "sgd_step",
      [](const TensorListArg& params, const TensorListArg& grads, const TensorListArg& momentum_buffers,
         const std::vector<bool>& first_step, const SgdOptions& options, const OptionalTensorArg& grad_scale,
         const OptionalTensorArg& found_inf, const OptionalTensorListArg& bottoms) {
        constexpr std::string_view op = "SGD";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       b = to_views(momentum_buffers, op, "momentum_buffers");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        const optim::SgdTensors tensors{p.views, g.views, b.views, first_step, x.bottoms.views};
        py::gil_scoped_release release;
        optim::sgd_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("first_step"), py::arg("options"),
      py::kw_only(), grad_scale, found_inf, bottoms);
}

}  // namespace ember::binding
