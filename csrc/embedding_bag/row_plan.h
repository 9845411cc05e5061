// The backward passes' plan: each table's positions grouped by the row they name (row_sort.h), the segments the
// row kernels walk, with each position's bag and, for mode mean, each bag's 1 / length. Internal to ember_core
// (embedding_bag.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "embedding_bag_checks.h"

namespace ember::embedding_bag {

// One table's positions grouped by row: the segments the row kernels walk.
struct RowPlan {
  std::vector<int32_t> sorted, bag_of;
  std::vector<float> inv_len;       // mean: 1 / the length of each bag (float32 and bfloat16 tables)
  std::vector<double> inv_len_f64;  // the same for a float64 table
  std::vector<int64_t> starts, rows_of;
  int64_t bad_position = -1;
  int64_t segments() const { return static_cast<int64_t>(rows_of.size()); }
};

// Plans every table in parallel (one table a task) and throws for the first bad index before anything is written.
std::vector<RowPlan> plan_rows(const std::vector<Table>& tables, const std::vector<Shape>& shapes,
                               const Options& options);

}  // namespace ember::embedding_bag
