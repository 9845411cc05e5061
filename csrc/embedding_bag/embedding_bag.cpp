// Merged embedding bags: argument checks, the split of the tables' bags over threads, and the backward plan (each
// table's positions grouped by row). The arithmetic lives in embedding_bag_body.inl.
#include "ember/embedding_bag.h"

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "embedding_bag_kernels.h"
#include "ember/cpu_features.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/trace.h"
#include "row_sort.h"

namespace ember::embedding_bag {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "merged_embedding_bag";

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

// A work unit of the bag passes costs at least this many row elements (a few microseconds), so that a unit
// amortizes its dispatch.
constexpr int64_t kUnitElements = 1 << 14;
// Row segments a thread takes at a time in the backward pass.
constexpr int64_t kSegmentGrain = 16;

// What the checks learned about one table.
struct Shape {
  int64_t rows = 0, dim = 0, n = 0, bags = 0;
  int64_t used = 0;          // the bags cover positions [0, used)
  DType dtype = DType::f32;  // the weight's; per-sample weights and their gradients are arithmetic_dtype(dtype)
  bool idx64 = false;
};

template <typename Idx>
int64_t check_offsets(const Idx* offsets, int64_t count, int64_t n, size_t t, bool include_last_offset) {
  if (count == 0) return 0;
  EMBER_CHECK(offsets[0] == 0, ValueError, kOp, ": offsets[", t, "] must start at 0, got ", offsets[0]);
  for (int64_t i = 1; i < count; ++i) {
    EMBER_CHECK(offsets[i] >= offsets[i - 1], ValueError, kOp, ": offsets[", t, "] must not decrease, got ",
                offsets[i - 1], " then ", offsets[i], " at ", i);
  }
  const auto last = static_cast<int64_t>(offsets[count - 1]);
  EMBER_CHECK(last <= n, ValueError, kOp, ": offsets[", t, "] must not pass the end of indices[", t, "] (", n,
              " indices), got ", last);
  return include_last_offset ? last : n;
}

Shape check_table(const Table& table, size_t t, const Options& options) {
  Shape s;
  const TensorView& w = table.weight;
  EMBER_CHECK(w.ndim() == 2, ValueError, kOp, ": weights[", t, "] must be 2-D [rows, dim], got ", w.describe());
  EMBER_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f64, TypeError, kOp,
              ": weights[", t, "] must have dtype float32, bfloat16 or float64, got ", dtype_name(w.dtype()));
  check::contiguous(kOp, check::item_name("weights", t), w);
  s.rows = w.size(0);
  s.dim = w.size(1);
  s.dtype = w.dtype();

  const TensorView& idx = table.indices;
  EMBER_CHECK(idx.ndim() == 1, ValueError, kOp, ": indices[", t, "] must be 1-D, got ", idx.describe());
  EMBER_CHECK(idx.dtype() == DType::i64 || idx.dtype() == DType::i32, TypeError, kOp, ": indices[", t,
              "] must have dtype int64 or int32, got ", dtype_name(idx.dtype()));
  check::contiguous(kOp, check::item_name("indices", t), idx);
  s.n = idx.size(0);
  EMBER_CHECK(s.n <= INT32_MAX, ValueError, kOp, ": indices[", t, "] holds ", s.n, " indices; at most ", INT32_MAX,
              " a table in one call");
  s.idx64 = idx.dtype() == DType::i64;

  const TensorView& off = table.offsets;
  EMBER_CHECK(off.ndim() == 1, ValueError, kOp, ": offsets[", t, "] must be 1-D, got ", off.describe());
  check::dtype(kOp, check::item_name("offsets", t), off, idx.dtype());
  check::contiguous(kOp, check::item_name("offsets", t), off);
  if (options.include_last_offset) {
    EMBER_CHECK(off.size(0) >= 1, ValueError, kOp, ": offsets[", t,
                "] must hold at least the last offset with include_last_offset, got an empty tensor");
  }
  s.bags = off.size(0) - (options.include_last_offset ? 1 : 0);
  s.used = s.idx64 ? check_offsets(off.data_as<const int64_t>(), off.size(0), s.n, t, options.include_last_offset)
                   : check_offsets(off.data_as<const int32_t>(), off.size(0), s.n, t, options.include_last_offset);

  if (table.per_sample_weights) {
    const TensorView& psw = *table.per_sample_weights;
    EMBER_CHECK(options.mode == Mode::sum, ValueError, kOp,
                ": per_sample_weights are only supported with mode 'sum', as in torch.nn.EmbeddingBag");
    check::dtype(kOp, check::item_name("per_sample_weights", t), psw, arithmetic_dtype(s.dtype));
    check::contiguous(kOp, check::item_name("per_sample_weights", t), psw);
    EMBER_CHECK(psw.ndim() == 1 && psw.size(0) == s.n, ValueError, kOp, ": per_sample_weights[", t,
                "] must have the shape of indices[", t, "] ([", s.n, "]), got ", psw.describe());
  }
  return s;
}

void check_rows_tensor(std::string_view list, size_t t, const TensorView& v, const Shape& s, DType dtype) {
  const check::Name name = check::item_name(list, t);
  check::dtype(kOp, name, v, dtype);
  check::contiguous(kOp, name, v);
  EMBER_CHECK(v.ndim() == 2 && v.size(0) == s.bags && v.size(1) == s.dim, ValueError, kOp, ": ", name, " must be [",
              s.bags, ", ", s.dim, "] (bags x dim), got ", v.describe());
}

// The checks every entry point shares: the tables, and one [bags, dim] tensor per table of the weight's dtype
// (the outputs, or the gradients of the outputs). Read-only inputs go into `items` for the overlap check.
std::vector<Shape> check_call(const std::vector<Table>& tables, const std::vector<TensorView>& per_table,
                              std::string_view per_table_name, bool per_table_written, const Options& options,
                              std::vector<check::ListItem>& items) {
  EMBER_CHECK(per_table.size() == tables.size(), ValueError, kOp, ": ", per_table_name,
              " must have one tensor per table (", tables.size(), "), got ", per_table.size());
  std::vector<Shape> shapes;
  shapes.reserve(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const Table& table = tables[t];
    shapes.push_back(check_table(table, t, options));
    check_rows_tensor(per_table_name, t, per_table[t], shapes.back(), table.weight.dtype());
    items.push_back({"indices", t, &table.indices, false});
    items.push_back({"offsets", t, &table.offsets, false});
    if (table.per_sample_weights) items.push_back({"per_sample_weights", t, &*table.per_sample_weights, false});
    items.push_back({per_table_name, t, &per_table[t], per_table_written});
  }
  return shapes;
}

// Calls f(W{}, Idx{}) with the storage types of a table.
template <typename F>
void with_types(const Shape& s, F&& f) {
  with_float_storage(s.dtype, [&](auto w) { s.idx64 ? f(w, int64_t{}) : f(w, int32_t{}); });
}

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

template <typename Idx>
int64_t bag_begin(const Table& table, int64_t b) {
  return static_cast<int64_t>(table.offsets.data_as<const Idx>()[b]);
}

// Which of a row's cache lines the pooling loop prefetches ahead (the rest it loads when their turn comes), measured
// with every batch's rows coming from memory (26 tables up to 10^7 rows on the Xeon, 10^6 on Zen 5, batch 2048,
// batches in rotation as bench_embedding_bag.py runs them). Intel's L2 streamer follows a row once its first line
// misses: the first line alone was faster at 1 / 10 / 100 indices a bag (16 threads: 999 / 3725 / 27244 us against
// 1102 / 4144 / 30967 with every line). Zen 5 wanted every line for short bags (2 threads; 1, 2, 4 indices: 1413,
// 1951, 2675 us against 1741, 2057, 2885) and the first line alone for long ones (10: 5451 against 6080 us; 100:
// 28.6 against 33.9 ms); the switch sits at 8, between the points measured.
RowPrefetch row_prefetch(const Shape& s) {
  static const bool intel = cpu_features().vendor == "GenuineIntel";  // asked once a unit: no string compare there
  if (intel) return RowPrefetch::first_line;
  return s.used >= 8 * s.bags ? RowPrefetch::first_line : RowPrefetch::every_line;
}

// A run of one table's bags.
struct Unit {
  size_t table;
  int64_t bag_begin, bag_end;
};

// Splits each table's bags into at most num_threads() runs of equal cost (none under kUnitElements row elements)
// and orders the runs by slot: run k of a table split n ways goes to slot k * threads / n. parallel_for gives each
// thread a contiguous range of units, so each thread gets its share of every table. In table order one thread got
// the small tables (cache hits) and another the large ones (a DRAM miss a row): on Zen 5, 2 threads, 26 tables up
// to 10^6 rows, 10 indices a bag, the second thread then added almost nothing over one.
std::vector<Unit> split_bags(const std::vector<Table>& tables, const std::vector<Shape>& shapes) {
  const int64_t threads = num_threads();
  std::vector<std::pair<int64_t, Unit>> slotted;
  for (size_t t = 0; t < tables.size(); ++t) {
    const Shape& s = shapes[t];
    const int64_t width = std::max<int64_t>(s.dim, 1);
    const int64_t total = (s.used + s.bags) * width;
    const int64_t runs = std::clamp<int64_t>(total / kUnitElements, 1, threads);
    const int64_t target = (total + runs - 1) / runs;
    auto start = [&](int64_t b) {
      return s.idx64 ? bag_begin<int64_t>(tables[t], b) : bag_begin<int32_t>(tables[t], b);
    };
    for (int64_t first = 0, k = 0; first < s.bags; ++k) {
      // Bags [first, last) cost (positions + bags) * dim; grow `last` by bisection on the offsets.
      int64_t lo = first + 1, hi = s.bags;
      auto cost = [&](int64_t last) {
        const int64_t end = last < s.bags ? start(last) : s.used;
        return (end - start(first) + (last - first)) * width;
      };
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cost(mid) < target) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      slotted.push_back({k * threads / runs, Unit{t, first, lo}});
      first = lo;
    }
  }
  std::stable_sort(slotted.begin(), slotted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Unit> units;
  units.reserve(slotted.size());
  for (const auto& [slot, unit] : slotted) units.push_back(unit);
  return units;
}

// The first position of [begin, end) whose index is outside [0, rows), or -1.
template <typename Idx>
int64_t first_bad_index(const Idx* indices, int64_t begin, int64_t end, int64_t rows) {
  for (int64_t p = begin; p < end; ++p) {
    if (indices[p] < 0 || static_cast<int64_t>(indices[p]) >= rows) return p;
  }
  return -1;
}

[[noreturn]] void throw_bad_index(const Table& table, const Shape& s, size_t t, int64_t p) {
  const int64_t value = s.idx64 ? table.indices.data_as<const int64_t>()[p]
                                : static_cast<int64_t>(table.indices.data_as<const int32_t>()[p]);
  throw IndexError(::ember::detail::concat(kOp, ": indices[", t, "][", p, "] is ", value, ", out of range for table ",
                                           t, " of ", s.rows, " rows"));
}

// Checks every index the bags use, in parallel over the units; throws for the first bad one (lowest table, then
// position), so the message does not depend on the thread count.
void check_indices(const std::vector<Table>& tables, const std::vector<Shape>& shapes, const std::vector<Unit>& units) {
  std::vector<int64_t> bad(units.size(), -1);
  parallel_for(static_cast<int64_t>(units.size()), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const Unit& unit = units[u];
      const Table& table = tables[unit.table];
      const Shape& s = shapes[unit.table];
      with_types(s, [&](auto, auto idx) {
        using Idx = decltype(idx);
        const int64_t first = bag_begin<Idx>(table, unit.bag_begin);
        const int64_t last = unit.bag_end < s.bags ? bag_begin<Idx>(table, unit.bag_end) : s.used;
        bad[u] = first_bad_index(table.indices.data_as<const Idx>(), first, last, s.rows);
      });
    }
  });
  // The units are in slot order, not table order: find the lowest (table, position) among the bad ones.
  std::optional<std::pair<size_t, int64_t>> first;
  for (size_t u = 0; u < units.size(); ++u) {
    if (bad[u] >= 0 && (!first || std::pair(units[u].table, bad[u]) < *first))
      first = std::pair(units[u].table, bad[u]);
  }
  if (first) throw_bad_index(tables[first->first], shapes[first->first], first->first, first->second);
}

// Runs body(unit) for every unit, in parallel.
template <typename Body>
void for_each_unit(const std::vector<Unit>& units, Body&& body) {
  parallel_for(static_cast<int64_t>(units.size()), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) body(units[u]);
  });
}

// --- backward plan ------------------------------------------------------------------------------------------------

// One table's positions grouped by row: the segments the row kernels walk.
struct RowPlan {
  std::vector<int32_t> sorted, bag_of;
  std::vector<float> inv_len;       // mean: 1 / the length of each bag (float32 and bfloat16 tables)
  std::vector<double> inv_len_f64;  // the same for a float64 table
  std::vector<int64_t> starts, rows_of;
  int64_t bad_position = -1;
  int64_t segments() const { return static_cast<int64_t>(rows_of.size()); }
};

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

// Plans every table in parallel (one table a task) and throws for the first bad index before anything is written.
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

// The checks of a fused update: the call's, then what each table's state must be. Returns the tables' shapes.
std::vector<Shape> check_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                const std::vector<UpdateState>& states, const Options& options, bool adagrad) {
  std::vector<check::ListItem> items;
  std::vector<Shape> shapes = check_call(tables, grad_outs, "grads", false, options, items);
  EMBER_CHECK(states.size() == tables.size(), ValueError, kOp, ": states must have one entry per table (",
              tables.size(), "), got ", states.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const Shape& s = shapes[t];
    EMBER_CHECK(s.dtype != DType::f64, TypeError, kOp,
                ": fused updates take float32 or bfloat16 weights, got "
                "float64 for weights[",
                t, "] (float64 tables support the lookup and its gradients)");
    items.push_back({"weights", t, &tables[t].weight, true});
    const UpdateState& state = states[t];
    if (state.bottom) {
      EMBER_CHECK(s.dtype == DType::bf16, TypeError, kOp, ": bottoms[", t,
                  "] belongs to a split-BF16 weight, but weights[", t, "] is ", dtype_name(s.dtype));
      check::dtype(kOp, check::item_name("bottoms", t), *state.bottom, DType::i16);
      check::contiguous(kOp, check::item_name("bottoms", t), *state.bottom);
      check::same_shape(kOp, check::item_name("bottoms", t), *state.bottom, check::item_name("weights", t),
                        tables[t].weight);
      items.push_back({"bottoms", t, &*state.bottom, true});
    }
    if (adagrad) {
      EMBER_CHECK(state.state_sum && state.step, ValueError, kOp, ": Adagrad needs state_sums[", t, "] and steps[", t,
                  "]");
      check::dtype(kOp, check::item_name("state_sums", t), *state.state_sum, DType::f32);
      check::contiguous(kOp, check::item_name("state_sums", t), *state.state_sum);
      check::same_shape(kOp, check::item_name("state_sums", t), *state.state_sum, check::item_name("weights", t),
                        tables[t].weight);
      check::dtype(kOp, check::item_name("steps", t), *state.step, DType::f32);
      EMBER_CHECK(state.step->numel() == 1, ValueError, kOp, ": steps[", t, "] must hold one element, got ",
                  state.step->describe());
      items.push_back({"state_sums", t, &*state.state_sum, true});
      items.push_back({"steps", t, &*state.step, true});
    }
  }
  check::no_overlaps(kOp, items);
  return shapes;
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
