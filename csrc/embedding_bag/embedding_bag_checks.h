// The argument checks every merged embedding bag entry point shares, and what they learn about each table.
// Internal to ember_core (embedding_bag.cpp, bag_units.cpp, row_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ember/checked.h"
#include "ember/embedding_bag.h"
#include "ember/tensor_view.h"

namespace ember::embedding_bag {

inline constexpr std::string_view kOp = "merged_embedding_bag";

// What the checks learned about one table.
struct Shape {
  int64_t rows = 0, dim = 0, n = 0, bags = 0;
  int64_t used = 0;          // the bags cover positions [0, used)
  DType dtype = DType::f32;  // the weight's; per-sample weights and their gradients are arithmetic_dtype(dtype)
  bool idx64 = false;
};

// Calls f(W{}, Idx{}) with the storage types of a table.
template <typename F>
void with_types(const Shape& s, F&& f) {
  with_float_storage(s.dtype, [&](auto w) { s.idx64 ? f(w, int64_t{}) : f(w, int32_t{}); });
}

/// The checks every entry point shares: the tables, and one [bags, dim] tensor per table of the weight's dtype (the
/// outputs, or the gradients of the outputs). Read-only inputs go into `items` for the overlap check.
std::vector<Shape> check_call(const std::vector<Table>& tables, const std::vector<TensorView>& per_table,
                              std::string_view per_table_name, bool per_table_written, const Options& options,
                              std::vector<check::ListItem>& items);

/// The checks of a fused update: the call's, then what each table's state must be. Returns the tables' shapes.
std::vector<Shape> check_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                const std::vector<UpdateState>& states, const Options& options, bool adagrad);

/// The first position of [begin, end) whose index is outside [0, rows), or -1.
template <typename Idx>
int64_t first_bad_index(const Idx* indices, int64_t begin, int64_t end, int64_t rows) {
  for (int64_t p = begin; p < end; ++p) {
    if (indices[p] < 0 || static_cast<int64_t>(indices[p]) >= rows) return p;
  }
  return -1;
}

/// Throws IndexError for position p of table t, whose index is out of range.
[[noreturn]] void throw_bad_index(const Table& table, const Shape& s, size_t t, int64_t p);

}  // namespace ember::embedding_bag
