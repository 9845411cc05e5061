// The forward passes' work: each table's bags split into runs of equal cost, spread so that every thread gets its
// share of every table, and the index checks over those runs. Internal to ember_core (embedding_bag.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "embedding_bag_checks.h"
#include "embedding_bag_kernels.h"
#include "ember/parallel.h"

namespace ember::embedding_bag {

// A run of one table's bags.
struct Unit {
  size_t table;
  int64_t bag_begin, bag_end;
};

/// The position where bag b of a table of index type Idx starts.
template <typename Idx>
int64_t bag_begin(const Table& table, int64_t b) {
  return static_cast<int64_t>(table.offsets.data_as<const Idx>()[b]);
}

// Splits each table's bags into at most num_threads() runs of equal cost (none under kUnitElements row elements)
// and orders the runs by slot: run k of a table split n ways goes to slot k * threads / n. parallel_for gives each
// thread a contiguous range of units, so each thread gets its share of every table. In table order one thread got
// the small tables (cache hits) and another the large ones (a DRAM miss a row): on Zen 5, 2 threads, 26 tables up
// to 10^6 rows, 10 indices a bag, the second thread then added almost nothing over one.
std::vector<Unit> split_bags(const std::vector<Table>& tables, const std::vector<Shape>& shapes);

// Checks every index the bags use, in parallel over the units; throws for the first bad one (lowest table, then
// position), so the message does not depend on the thread count.
void check_indices(const std::vector<Table>& tables, const std::vector<Shape>& shapes, const std::vector<Unit>& units);

// Runs body(unit) for every unit, in parallel.
template <typename Body>
void for_each_unit(const std::vector<Unit>& units, Body&& body) {
  parallel_for(static_cast<int64_t>(units.size()), 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) body(units[u]);
  });
}

/// Which of a row's cache lines the pooling loop prefetches ahead for a table of shape `s` (bag_units.cpp says what
/// was measured).
kernels::RowPrefetch row_prefetch(const Shape& s);

}  // namespace ember::embedding_bag
