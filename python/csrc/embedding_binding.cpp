// ember._C bindings of the merged embedding bags: lists of DLPack objects per table in, one core call with the
// GIL released; gradients of unknown size come back as DLPack capsules the core's vectors own.
#include "embedding_binding.h"

#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dlpack_arg.h"
#include "dlpack_owned.h"
#include "ember/embedding_bag.h"
#include "ember/errors.h"
#include "tensor_args.h"
#include "view_lists.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

namespace eb = embedding_bag;
constexpr std::string_view kOp = "merged_embedding_bag";

// The tables of a call: weights, indices, offsets and per-sample weights (None entries allowed), one per table.
struct Tables {
  ViewList weights, indices, offsets;
  OptionalViewList per_sample_weights;
  std::vector<eb::Table> tables;
};

Tables to_tables(const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
                 const OptionalTensorListArg& per_sample_weights) {
  Tables t{to_views(weights, kOp, "weights"),
           to_views(indices, kOp, "indices"),
           to_views(offsets, kOp, "offsets"),
           to_optional_views(per_sample_weights, kOp, "per_sample_weights"),
           {}};
  const size_t n = t.weights.views.size();
  for (auto [name, size] : {std::pair{"indices", t.indices.views.size()}, std::pair{"offsets", t.offsets.views.size()},
                            std::pair{"per_sample_weights", t.per_sample_weights.views.size()}}) {
    EMBER_CHECK(size == n, ValueError, kOp, ": ", name, " must have one entry per table (", n, "), got ", size);
  }
  t.tables.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    t.tables.push_back({t.weights.views[i], t.indices.views[i], t.offsets.views[i], t.per_sample_weights.views[i]});
  }
  return t;
}

eb::Options to_options(const std::string& mode, bool include_last_offset) {
  eb::Options options;
  if (mode == "sum") {
    options.mode = eb::Mode::sum;
  } else if (mode == "mean") {
    options.mode = eb::Mode::mean;
  } else {
    throw ValueError(std::string(kOp) + ": mode must be 'sum' or 'mean', got '" + mode + "'");
  }
  options.include_last_offset = include_last_offset;
  return options;
}

std::vector<eb::UpdateState> to_states(size_t n, const OptionalViewList& bottoms, const OptionalViewList* state_sums,
                                       const OptionalViewList* steps) {
  EMBER_CHECK(bottoms.views.size() == n, ValueError, kOp, ": bottoms must have one entry per table (", n, "), got ",
              bottoms.views.size());
  std::vector<eb::UpdateState> states(n);
  for (size_t i = 0; i < n; ++i) {
    states[i].bottom = bottoms.views[i];
    if (state_sums != nullptr) {
      EMBER_CHECK(state_sums->views.size() == n && steps->views.size() == n, ValueError, kOp,
                  ": state_sums and steps must have one entry per table (", n, ")");
      states[i].state_sum = state_sums->views[i];
      states[i].step = steps->views[i];
    }
  }
  return states;
}

}  // namespace

void bind_embedding_bag(py::module_& m) {
  m.def("embedding_bag_implementation", []() { return std::string(isa_name(eb::implementation())); });

  m.def(
      "merged_embedding_bag_forward",
      [](const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
         const OptionalTensorListArg& per_sample_weights, const TensorListArg& out, const std::string& mode,
         bool include_last_offset) {
        const Tables t = to_tables(weights, indices, offsets, per_sample_weights);
        const ViewList o = to_views(out, kOp, "out");
        const eb::Options options = to_options(mode, include_last_offset);
        py::gil_scoped_release release;
        eb::forward(t.tables, o.views, options);
      },
      py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"), py::arg("out"),
      py::kw_only(), py::arg("mode"), py::arg("include_last_offset"));

  m.def(
      "merged_embedding_bag_backward",
      [](const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
         const OptionalTensorListArg& per_sample_weights, const TensorListArg& grads, const std::string& mode,
         bool include_last_offset) {
        const Tables t = to_tables(weights, indices, offsets, per_sample_weights);
        const ViewList g = to_views(grads, kOp, "grads");
        const eb::Options options = to_options(mode, include_last_offset);
        std::vector<eb::RowGradient> result;
        {
          py::gil_scoped_release release;
          result = eb::backward(t.tables, g.views, options);
        }
        py::typing::List<py::typing::Tuple<py::capsule, py::capsule>> out;
        for (size_t i = 0; i < result.size(); ++i) {
          const auto rows = static_cast<int64_t>(result[i].rows.size());
          const int64_t dim = t.tables[i].weight.size(1);
          py::capsule values =
              std::visit([&](auto& v) { return owned_dlpack(std::move(v), {rows, dim}); }, result[i].values);
          out.append(py::make_tuple(owned_dlpack(std::move(result[i].rows), {rows}), std::move(values)));
        }
        return out;
      },
      py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"), py::arg("grads"),
      py::kw_only(), py::arg("mode"), py::arg("include_last_offset"),
      "Per table, (rows, values): the rows the bags touched, ascending, and their gradients (float32, float64 for a "
      "float64 table), as DLPack capsules.");

  m.def(
      "merged_embedding_bag_per_sample_weights_backward",
      [](const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
         const OptionalTensorListArg& per_sample_weights, const TensorListArg& grads,
         const OptionalTensorListArg& grad_per_sample_weights, const std::string& mode, bool include_last_offset) {
        const Tables t = to_tables(weights, indices, offsets, per_sample_weights);
        const ViewList g = to_views(grads, kOp, "grads");
        const OptionalViewList out = to_optional_views(grad_per_sample_weights, kOp, "grad_per_sample_weights");
        const eb::Options options = to_options(mode, include_last_offset);
        py::gil_scoped_release release;
        eb::per_sample_weights_backward(t.tables, g.views, out.views, options);
      },
      py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"), py::arg("grads"),
      py::arg("grad_per_sample_weights"), py::kw_only(), py::arg("mode"), py::arg("include_last_offset"));

  m.def(
      "merged_embedding_bag_sgd_update",
      [](const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
         const OptionalTensorListArg& per_sample_weights, const TensorListArg& grads,
         const OptionalTensorListArg& bottoms, const std::string& mode, bool include_last_offset, double lr,
         double weight_decay) {
        const Tables t = to_tables(weights, indices, offsets, per_sample_weights);
        const ViewList g = to_views(grads, kOp, "grads");
        const OptionalViewList b = to_optional_views(bottoms, kOp, "bottoms");
        const std::vector<eb::UpdateState> states = to_states(t.tables.size(), b, nullptr, nullptr);
        const eb::Options options = to_options(mode, include_last_offset);
        py::gil_scoped_release release;
        eb::sgd_update(t.tables, g.views, states, options, {lr, weight_decay});
      },
      py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"), py::arg("grads"),
      py::arg("bottoms"), py::kw_only(), py::arg("mode"), py::arg("include_last_offset"), py::arg("lr"),
      py::arg("weight_decay"));

  m.def(
      "merged_embedding_bag_adagrad_update",
      [](const TensorListArg& weights, const TensorListArg& indices, const TensorListArg& offsets,
         const OptionalTensorListArg& per_sample_weights, const TensorListArg& grads,
         const OptionalTensorListArg& bottoms, const OptionalTensorListArg& state_sums,
         const OptionalTensorListArg& steps, const std::string& mode, bool include_last_offset, double lr,
         double lr_decay, double weight_decay, double eps) {
        const Tables t = to_tables(weights, indices, offsets, per_sample_weights);
        const ViewList g = to_views(grads, kOp, "grads");
        const OptionalViewList b = to_optional_views(bottoms, kOp, "bottoms");
        const OptionalViewList sums = to_optional_views(state_sums, kOp, "state_sums");
        const OptionalViewList st = to_optional_views(steps, kOp, "steps");
        const std::vector<eb::UpdateState> states = to_states(t.tables.size(), b, &sums, &st);
        const eb::Options options = to_options(mode, include_last_offset);
        py::gil_scoped_release release;
        eb::adagrad_update(t.tables, g.views, states, options, {lr, lr_decay, weight_decay, eps});
      },
      py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"), py::arg("grads"),
      py::arg("bottoms"), py::arg("state_sums"), py::arg("steps"), py::kw_only(), py::arg("mode"),
      py::arg("include_last_offset"), py::arg("lr"), py::arg("lr_decay"), py::arg("weight_decay"), py::arg("eps"));
}

}  // namespace ember::binding
