// ember._C bindings of the fused optimizer steps: lists of DLPack objects in, one core call, GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string_view>
#include <vector>

#include "dlpack_arg.h"
#include "ember/optim.h"
#include "optim_binding.h"
#include "view_lists.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

struct OptionalView {
  std::optional<DLPackArg> arg;
  std::optional<TensorView> view;
};

OptionalView to_optional_view(const py::object& obj, std::string_view op, std::string_view name) {
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

StepExtras to_step_extras(const py::object& grad_scale, const py::object& found_inf, const py::sequence& bottoms,
                          std::string_view op) {
  return {to_optional_view(grad_scale, op, "grad_scale"), to_optional_view(found_inf, op, "found_inf"),
          to_optional_views(bottoms, op, "bottoms")};
}

}  // namespace

void bind_optim(py::module_& m) {
  m.def(
      "adam_step",
      [](const py::sequence& params, const py::sequence& grads, const py::sequence& exp_avgs,
         const py::sequence& exp_avg_sqs, const py::sequence& max_exp_avg_sqs, const py::sequence& steps, double lr,
         double beta1, double beta2, double eps, double weight_decay, bool decoupled_weight_decay, bool amsgrad,
         bool maximize, const py::object& grad_scale, const py::object& found_inf, const py::sequence& bottoms) {
        constexpr std::string_view op = "Adam";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       m1 = to_views(exp_avgs, op, "exp_avgs"), m2 = to_views(exp_avg_sqs, op, "exp_avg_sqs"),
                       mx = to_views(max_exp_avg_sqs, op, "max_exp_avg_sqs"), s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        optim::AdamTensors tensors{p.views, g.views, m1.views, m2.views, mx.views, s.views, x.bottoms.views};
        optim::AdamOptions options;
        options.lr = lr;
        options.beta1 = beta1;
        options.beta2 = beta2;
        options.eps = eps;
        options.weight_decay = weight_decay;
        options.decoupled_weight_decay = decoupled_weight_decay;
        options.amsgrad = amsgrad;
        options.maximize = maximize;
        py::gil_scoped_release release;
        optim::adam_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("max_exp_avg_sqs"),
      py::arg("steps"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("weight_decay"), py::arg("decoupled_weight_decay"), py::arg("amsgrad"), py::arg("maximize"),
      py::arg("grad_scale") = py::none(), py::arg("found_inf") = py::none(), py::arg("bottoms") = py::tuple());

  m.def(
      "adagrad_step",
      [](const py::sequence& params, const py::sequence& grads, const py::sequence& state_sums,
         const py::sequence& steps, double lr, double lr_decay, double weight_decay, double eps, bool maximize,
         const py::object& grad_scale, const py::object& found_inf, const py::sequence& bottoms) {
        constexpr std::string_view op = "Adagrad";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       sums = to_views(state_sums, op, "state_sums"), s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        optim::AdagradTensors tensors{p.views, g.views, sums.views, s.views, x.bottoms.views};
        optim::AdagradOptions options;
        options.lr = lr;
        options.lr_decay = lr_decay;
        options.weight_decay = weight_decay;
        options.eps = eps;
        options.maximize = maximize;
        py::gil_scoped_release release;
        optim::adagrad_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("state_sums"), py::arg("steps"), py::kw_only(), py::arg("lr"),
      py::arg("lr_decay"), py::arg("weight_decay"), py::arg("eps"), py::arg("maximize"),
      py::arg("grad_scale") = py::none(), py::arg("found_inf") = py::none(), py::arg("bottoms") = py::tuple());

  m.def(
      "lamb_step",
      [](const py::sequence& params, const py::sequence& grads, const py::sequence& exp_avgs,
         const py::sequence& exp_avg_sqs, const py::sequence& steps, double lr, double beta1, double beta2, double eps,
         double weight_decay, bool bias_correction, bool maximize, const py::object& grad_scale,
         const py::object& found_inf, const py::sequence& bottoms) {
        constexpr std::string_view op = "Lamb";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       m1 = to_views(exp_avgs, op, "exp_avgs"), m2 = to_views(exp_avg_sqs, op, "exp_avg_sqs"),
                       s = to_views(steps, op, "steps");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        optim::LambTensors tensors{p.views, g.views, m1.views, m2.views, s.views, x.bottoms.views};
        optim::LambOptions options;
        options.lr = lr;
        options.beta1 = beta1;
        options.beta2 = beta2;
        options.eps = eps;
        options.weight_decay = weight_decay;
        options.bias_correction = bias_correction;
        options.maximize = maximize;
        py::gil_scoped_release release;
        optim::lamb_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("steps"), py::kw_only(),
      py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("bias_correction"), py::arg("maximize"), py::arg("grad_scale") = py::none(),
      py::arg("found_inf") = py::none(), py::arg("bottoms") = py::tuple());

  m.def(
      "lars_step",
      [](const py::sequence& params, const py::sequence& grads, const py::sequence& momentum_buffers,
         const std::vector<bool>& first_step, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov, double trust_coefficient, double eps, bool maximize, const py::object& grad_scale,
         const py::object& found_inf, const py::sequence& bottoms) {
        constexpr std::string_view op = "LARS";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       b = to_views(momentum_buffers, op, "momentum_buffers");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        optim::SgdTensors tensors{p.views, g.views, b.views, first_step, x.bottoms.views};
        optim::LarsOptions options;
        options.lr = lr;
        options.momentum = momentum;
        options.dampening = dampening;
        options.weight_decay = weight_decay;
        options.nesterov = nesterov;
        options.trust_coefficient = trust_coefficient;
        options.eps = eps;
        options.maximize = maximize;
        py::gil_scoped_release release;
        optim::lars_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("first_step"), py::kw_only(),
      py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"),
      py::arg("trust_coefficient"), py::arg("eps"), py::arg("maximize"), py::arg("grad_scale") = py::none(),
      py::arg("found_inf") = py::none(), py::arg("bottoms") = py::tuple());

  m.def(
      "sgd_step",
      [](const py::sequence& params, const py::sequence& grads, const py::sequence& momentum_buffers,
         const std::vector<bool>& first_step, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov, bool maximize, const py::object& grad_scale, const py::object& found_inf,
         const py::sequence& bottoms) {
        constexpr std::string_view op = "SGD";
        const ViewList p = to_views(params, op, "params"), g = to_views(grads, op, "grads"),
                       b = to_views(momentum_buffers, op, "momentum_buffers");
        const StepExtras x = to_step_extras(grad_scale, found_inf, bottoms, op);
        optim::SgdTensors tensors{p.views, g.views, b.views, first_step, x.bottoms.views};
        optim::SgdOptions options;
        options.lr = lr;
        options.momentum = momentum;
        options.dampening = dampening;
        options.weight_decay = weight_decay;
        options.nesterov = nesterov;
        options.maximize = maximize;
        py::gil_scoped_release release;
        optim::sgd_step(tensors, options, x.grad_scale.view, x.found_inf.view);
      },
      py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("first_step"), py::kw_only(),
      py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"),
      py::arg("maximize"), py::arg("grad_scale") = py::none(), py::arg("found_inf") = py::none(),
      py::arg("bottoms") = py::tuple());
}

}  // namespace ember::binding
