// Merged embedding bags' entry points: each checks its arguments (embedding_bag_checks.h), splits the work
// (bag_units.h for the bag passes, row_plan.h for the row passes) and runs the kernel of the active ISA over it.
// The arithmetic lives in embedding_bag_body.inl.
#include "ember/embedding_bag.h"

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "bag_units.h"
#include "embedding_bag_checks.h"
#include "embedding_bag_kernels.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/trace.h"
#include "row_plan.h"

namespace ember::embedding_bag {
namespace {

using namespace kernels;

template <typename W, typename Idx>
constexpr IsaImpl<PoolFn<W, Idx>> kPool[3] = {
    {Isa::avx512, pool_avx512<W, Idx>}, {Isa::avx2, pool_avx2<W, Idx>}, {Isa::ref, pool_ref<W, Idx>}};
template <typename W, typename Idx>
constexpr IsaImpl<PerSampleGradFn<W, Idx>> kPerSampleGrad[3] = {{Isa::avx512, per_sample_grad_avx512<W, Idx>},
                                                                {Isa::avx2, per_sample_grad_avx2<W, Idx>},
                                                                {Isa::ref, per_sample_grad_ref<W, Idx>}};
template <typename W>
constexpr IsaImpl<RowFn<W>> kRows[3] = {
    {Isa::avx512, rows_avx512<W>}, {Isa::avx2, rows_avx2<W>}, {Isa::ref, rows_ref<W>}};

// The body for storage W at `isa`: float64 tables take their one path (embedding_bag_f64.cpp) on every machine, the
// others their ISA's. (A float64 entry in the tables above would name ISA paths that do not exist.)
template <typename W, typename Idx>
PoolFn<W, Idx> pool_fn(Isa isa) {
  if constexpr (std::is_same_v<W, double>) {
    return pool_f64<Idx>;
  } else {
    return select_impl(kPool<W, Idx>, isa).fn;
  }
}
template <typename W, typename Idx>
PerSampleGradFn<W, Idx> per_sample_grad_fn(Isa isa) {
  if constexpr (std::is_same_v<W, double>) {
    return per_sample_grad_f64<Idx>;
  } else {
    return select_impl(kPerSampleGrad<W, Idx>, isa).fn;
  }
}
template <typename W>
RowFn<W> rows_fn(Isa isa) {
  if constexpr (std::is_same_v<W, double>) {
    return rows_f64;
  } else {
    return select_impl(kRows<W>, isa).fn;
  }
}

// Row segments a thread takes at a time in the backward pass.
constexpr int64_t kSegmentGrain = 16;

template <typename W, typename Idx>
BagArgs<W, Idx> bag_args(const Table& table, const Shape& s) {
  BagArgs<W, Idx> a;
  a.weight = table.weight.data_as<const W>();
  a.dim = s.dim;
  a.indices = table.indices.data_as<const Idx>();
  a.offsets = table.offsets.data_as<const Idx>();
  a.bags = s.bags;
  a.last_end = s.used;
  a.per_sample_weights = table.per_sample_weights ? table.per_sample_weights->data_as<const Arithmetic<W>>() : nullptr;
  return a;
}

template <typename W>
RowArgs<W> row_args(const Table& table, const TensorView& grad_out, const Shape& s, const RowPlan& plan) {
  RowArgs<W> a;
  a.dim = s.dim;
  a.grad_out = grad_out.data_as<const W>();
  a.sorted_pos = plan.sorted.data();
  a.positions = static_cast<int64_t>(plan.sorted.size());
  a.bag_of = plan.bag_of.data();
  a.per_sample_weights = table.per_sample_weights ? table.per_sample_weights->data_as<const Arithmetic<W>>() : nullptr;
  if constexpr (std::is_same_v<W, double>) {
    a.inv_len = plan.inv_len_f64.empty() ? nullptr : plan.inv_len_f64.data();
  } else {
    a.inv_len = plan.inv_len.empty() ? nullptr : plan.inv_len.data();
  }
  a.seg_start = plan.starts.data();
  a.seg_row = plan.rows_of.data();
  return a;
}

// Runs the row kernel over every table's segments, in parallel over all of them at once; `prepare(t, args)` fills
// in what the op writes.
template <typename Prepare>
void run_rows(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
              const std::vector<Shape>& shapes, const std::vector<RowPlan>& plans, Prepare&& prepare) {
  std::vector<int64_t> first(tables.size() + 1, 0);  // first[t]: table t's first segment in the global numbering
  for (size_t t = 0; t < tables.size(); ++t) first[t + 1] = first[t] + plans[t].segments();
  const Isa isa = active_isa();
  parallel_for(first.back(), kSegmentGrain, 1, [&](int64_t, int64_t begin, int64_t end) {
    size_t t = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), begin) - first.begin()) - 1;
    for (; t < tables.size() && first[t] < end; ++t) {
      const int64_t lo = std::max(begin, first[t]) - first[t], hi = std::min(end, first[t + 1]) - first[t];
      if (lo >= hi) continue;
      with_types(shapes[t], [&](auto w, auto) {
        using W = decltype(w);
        RowArgs<W> a = row_args<W>(tables[t], grad_outs[t], shapes[t], plans[t]);
        prepare(t, a);
        rows_fn<W>(isa)(a, lo, hi);
      });
    }
  });
}

}  // namespace

Isa implementation() { return select_impl(kPool<float, int64_t>, active_isa()).isa; }

void forward(const std::vector<Table>& tables, const std::vector<TensorView>& out, const Options& options) {
  std::vector<check::ListItem> items;
  const std::vector<Shape> shapes = check_call(tables, out, "out", true, options, items);
  for (size_t t = 0; t < tables.size(); ++t) items.push_back({"weights", t, &tables[t].weight, false});
  check::no_overlaps(kOp, items);
  const std::vector<Unit> units = split_bags(tables, shapes);
  check_indices(tables, shapes, units);
  const Isa isa = active_isa();
  const KernelTrace trace(kOp, select_impl(kPool<float, int64_t>, isa).isa,
                          [&] { return "tables=" + std::to_string(tables.size()); });
  for_each_unit(units, [&](const Unit& unit) {
    const Shape& s = shapes[unit.table];
    with_types(s, [&](auto w, auto idx) {
      using W = decltype(w);
      using Idx = decltype(idx);
      BagArgs<W, Idx> a = bag_args<W, Idx>(tables[unit.table], s);
      a.mean = options.mode == Mode::mean;
      a.out = out[unit.table].data_as<W>();
      a.prefetch = row_prefetch(s);
      pool_fn<W, Idx>(isa)(a, unit.bag_begin, unit.bag_end);
    });
  });
}

std::vector<RowGradient> backward(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                  const Options& options) {
  std::vector<check::ListItem> items;
  const std::vector<Shape> shapes = check_call(tables, grad_outs, "grads", false, options, items);
  std::vector<RowPlan> plans = plan_rows(tables, shapes, options);
  std::vector<RowGradient> grads(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const auto size = static_cast<size_t>(plans[t].segments() * shapes[t].dim);
    if (shapes[t].dtype == DType::f64) {
      grads[t].values = std::vector<double>(size);
    } else {
      grads[t].values = std::vector<float>(size);
    }
  }
  run_rows(tables, grad_outs, shapes, plans, [&](size_t t, auto& a) {
    using Values = std::vector<std::remove_pointer_t<decltype(a.values)>>;
    a.op = RowOp::gradient;
    a.values = std::get<Values>(grads[t].values).data();
  });
  for (size_t t = 0; t < tables.size(); ++t) grads[t].rows = std::move(plans[t].rows_of);
  return grads;
}

void per_sample_weights_backward(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                 const std::vector<std::optional<TensorView>>& grad_psws, const Options& options) {
  std::vector<check::ListItem> items;
  const std::vector<Shape> shapes = check_call(tables, grad_outs, "grads", false, options, items);
  EMBER_CHECK(grad_psws.size() == tables.size(), ValueError, kOp,
              ": grad_per_sample_weights must have one entry per table (", tables.size(), "), got ", grad_psws.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::optional<TensorView>& grad_psw = grad_psws[t];
    EMBER_CHECK(grad_psw.has_value() == tables[t].per_sample_weights.has_value(), ValueError, kOp,
                ": grad_per_sample_weights[", t, "] must be given exactly when table ", t, " has per_sample_weights");
    if (!grad_psw.has_value()) continue;
    check::dtype(kOp, check::item_name("grad_per_sample_weights", t), *grad_psw, arithmetic_dtype(shapes[t].dtype));
    check::contiguous(kOp, check::item_name("grad_per_sample_weights", t), *grad_psw);
    check::same_shape(kOp, check::item_name("grad_per_sample_weights", t), *grad_psw, check::item_name("indices", t),
                      tables[t].indices);
    items.push_back({"grad_per_sample_weights", t, &*grad_psw, true});
    items.push_back({"weights", t, &tables[t].weight, false});
  }
  check::no_overlaps(kOp, items);
  const std::vector<Unit> units = split_bags(tables, shapes);
  check_indices(tables, shapes, units);
  for (size_t t = 0; t < tables.size(); ++t) {  // positions past the last bag's end take no part
    const std::optional<TensorView>& grad_psw = grad_psws[t];
    if (!grad_psw.has_value()) continue;
    const TensorView& g = *grad_psw;
    if (shapes[t].dtype == DType::f64) {
      std::fill(g.data_as<double>() + shapes[t].used, g.data_as<double>() + shapes[t].n, 0.0);
    } else {
      std::fill(g.data_as<float>() + shapes[t].used, g.data_as<float>() + shapes[t].n, 0.0f);
    }
  }
  const Isa isa = active_isa();
  for_each_unit(units, [&](const Unit& unit) {
    if (!grad_psws[unit.table]) return;
    with_types(shapes[unit.table], [&](auto w, auto idx) {
      using W = decltype(w);
      using Idx = decltype(idx);
      BagArgs<W, Idx> a = bag_args<W, Idx>(tables[unit.table], shapes[unit.table]);
      a.grad_out = grad_outs[unit.table].data_as<const W>();
      a.grad_per_sample = grad_psws[unit.table]->data_as<Arithmetic<W>>();
      per_sample_grad_fn<W, Idx>(isa)(a, unit.bag_begin, unit.bag_end);
    });
  });
}

void sgd_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                const std::vector<UpdateState>& states, const Options& options, const SgdOptions& sgd) {
  check::finite_at_least(kOp, "lr", sgd.lr, 0.0);
  check::finite_at_least(kOp, "weight_decay", sgd.weight_decay, 0.0);
  const std::vector<Shape> shapes = check_update(tables, grad_outs, states, options, false);
  const std::vector<RowPlan> plans = plan_rows(tables, shapes, options);
  run_rows(tables, grad_outs, shapes, plans, [&](size_t t, auto& a) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(a.grad_out)>>;
    a.op = RowOp::sgd;
    a.weight = tables[t].weight.template data_as<W>();
    a.bottom = states[t].bottom ? states[t].bottom->template data_as<uint16_t>() : nullptr;
    a.neg_lr = static_cast<float>(-sgd.lr);
    a.weight_decay = static_cast<float>(sgd.weight_decay);
  });
}

void adagrad_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                    const std::vector<UpdateState>& states, const Options& options, const AdagradOptions& adagrad) {
  check::finite_at_least(kOp, "lr", adagrad.lr, 0.0);
  check::finite_at_least(kOp, "lr_decay", adagrad.lr_decay, 0.0);
  check::finite_at_least(kOp, "weight_decay", adagrad.weight_decay, 0.0);
  check::finite_at_least(kOp, "eps", adagrad.eps, 0.0);
  const std::vector<Shape> shapes = check_update(tables, grad_outs, states, options, true);
  const std::vector<RowPlan> plans = plan_rows(tables, shapes, options);
  std::vector<float> neg_clr(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::optional<TensorView>& step_state = states[t].step;
    EMBER_CHECK(step_state.has_value(), ValueError, kOp, ": states[", t, "].step is required");  // check_update's
    float& step = *step_state->data_as<float>();
    step += 1.0f;
    neg_clr[t] = static_cast<float>(-adagrad.lr / (1.0 + (static_cast<double>(step) - 1.0) * adagrad.lr_decay));
  }
  run_rows(tables, grad_outs, shapes, plans, [&](size_t t, auto& a) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(a.grad_out)>>;
    a.op = RowOp::adagrad;
    a.weight = tables[t].weight.template data_as<W>();
    a.bottom = states[t].bottom ? states[t].bottom->template data_as<uint16_t>() : nullptr;
    a.state_sum = states[t].state_sum->template data_as<Arithmetic<W>>();
    a.neg_lr = neg_clr[t];
    a.weight_decay = static_cast<float>(adagrad.weight_decay);
    a.eps = static_cast<float>(adagrad.eps);
  });
}

}  // namespace ember::embedding_bag
