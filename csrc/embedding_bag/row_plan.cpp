#include "row_plan.h"

#include <algorithm>

#include "ember/parallel.h"
#include "row_sort.h"

namespace ember::embedding_bag {
namespace {

template <typename Idx>
void build_plan(const Table& table, const Shape& s, const Options& options, RowPlan& plan) {
  const Idx* indices = table.indices.data_as<const Idx>();
  plan.bad_position = first_bad_index(indices, 0, s.used, s.rows);
  if (plan.bad_position >= 0) return;
  const Idx* offsets = table.offsets.data_as<const Idx>();
  plan.bag_of.resize(static_cast<size_t>(s.used));
  const bool mean = options.mode == Mode::mean, f64 = s.dtype == DType::f64;
  if (mean && f64) plan.inv_len_f64.resize(static_cast<size_t>(s.bags), 0.0);
  if (mean && !f64) plan.inv_len.resize(static_cast<size_t>(s.bags), 0.0f);
  for (int64_t b = 0; b < s.bags; ++b) {
    const int64_t begin = offsets[b], end = b + 1 < s.bags ? static_cast<int64_t>(offsets[b + 1]) : s.used;
    std::fill(plan.bag_of.begin() + begin, plan.bag_of.begin() + end, static_cast<int32_t>(b));
    if (!mean || end == begin) continue;
    if (f64) {
      plan.inv_len_f64[b] = 1.0 / static_cast<double>(end - begin);
    } else {
      plan.inv_len[b] = 1.0f / static_cast<float>(end - begin);
    }
  }
  std::vector<int32_t> scratch;
  detail::sort_positions(indices, static_cast<int32_t>(s.used), s.rows, plan.sorted, scratch);
  detail::find_runs(indices, plan.sorted, plan.starts, plan.rows_of);
}

}  // namespace

std::vector<RowPlan> plan_rows(const std::vector<Table>& tables, const std::vector<Shape>& shapes,
                               const Options& options) {
  std::vector<RowPlan> plans(tables.size());
  parallel_for(static_cast<int64_t>(tables.size()), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      with_types(shapes[t],
                 [&](auto, auto idx) { build_plan<decltype(idx)>(tables[t], shapes[t], options, plans[t]); });
    }
  });
  for (size_t t = 0; t < tables.size(); ++t) {
    if (plans[t].bad_position >= 0) throw_bad_index(tables[t], shapes[t], t, plans[t].bad_position);
  }
  return plans;
}

}  // namespace ember::embedding_bag
