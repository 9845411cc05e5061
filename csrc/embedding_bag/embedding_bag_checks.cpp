#include "embedding_bag_checks.h"

#include "ember/errors.h"

namespace ember::embedding_bag {
namespace {

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

}  // namespace

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

[[noreturn]] void throw_bad_index(const Table& table, const Shape& s, size_t t, int64_t p) {
  const int64_t value = s.idx64 ? table.indices.data_as<const int64_t>()[p]
                                : static_cast<int64_t>(table.indices.data_as<const int32_t>()[p]);
  throw IndexError(::ember::detail::concat(kOp, ": indices[", t, "][", p, "] is ", value, ", out of range for table ",
                                           t, " of ", s.rows, " rows"));
}

}  // namespace ember::embedding_bag
