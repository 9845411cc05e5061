// Grouping a table's lookups by row, for the backward pass: a stable radix sort of the positions by the row they
// name, then the runs of equal rows. Stable means the positions of one row stay in increasing order, which fixes
// the order their gradients are summed in, whatever the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::embedding_bag::detail {

/// The positions [0, n) ordered by keys[position] (each in [0, rows)), ties in increasing position. `scratch` is
/// resized as needed.
template <typename Idx>
void sort_positions(const Idx* keys, int32_t n, int64_t rows, std::vector<int32_t>& out, std::vector<int32_t>& scratch);

/// The runs of equal keys in `sorted`: run s covers sorted[starts[s] .. starts[s + 1]) and names row rows_of[s].
template <typename Idx>
void find_runs(const Idx* keys, const std::vector<int32_t>& sorted, std::vector<int64_t>& starts,
               std::vector<int64_t>& rows_of);

}  // namespace ember::embedding_bag::detail
