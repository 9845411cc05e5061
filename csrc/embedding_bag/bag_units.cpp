#include "bag_units.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "ember/cpu_features.h"

namespace ember::embedding_bag {
namespace {

// A work unit of the bag passes costs at least this many row elements (a few microseconds), so that a unit
// amortizes its dispatch.
constexpr int64_t kUnitElements = 1 << 14;

}  // namespace

// Which of a row's cache lines the pooling loop prefetches ahead (the rest it loads when their turn comes), measured
// with every batch's rows coming from memory (26 tables up to 10^7 rows on the Xeon, 10^6 on Zen 5, batch 2048,
// batches in rotation as bench_embedding_bag.py runs them). Intel's L2 streamer follows a row once its first line
// misses: the first line alone was faster at 1 / 10 / 100 indices a bag (16 threads: 999 / 3725 / 27244 us against
// 1102 / 4144 / 30967 with every line). Zen 5 wanted every line for short bags (2 threads; 1, 2, 4 indices: 1413,
// 1951, 2675 us against 1741, 2057, 2885) and the first line alone for long ones (10: 5451 against 6080 us; 100:
// 28.6 against 33.9 ms); the switch sits at 8, between the points measured.
kernels::RowPrefetch row_prefetch(const Shape& s) {
  static const bool intel = cpu_features().vendor == "GenuineIntel";  // asked once a unit: no string compare there
  if (intel) return kernels::RowPrefetch::first_line;
  return s.used >= 8 * s.bags ? kernels::RowPrefetch::first_line : kernels::RowPrefetch::every_line;
}

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

}  // namespace ember::embedding_bag
