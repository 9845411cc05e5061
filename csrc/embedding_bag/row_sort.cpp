// Stable LSD radix sort of positions by row (row_sort.h). Digits of 11 bits (a 16 KB count table, in L1): a table
// of up to 2^22 rows sorts in two passes over its positions, 10^7 rows in three. Each pass reads the keys through
// the previous pass's order; a table's indices are a few hundred KB a batch, so those reads stay in cache.
#include "row_sort.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <utility>

namespace ember::embedding_bag::detail {
namespace {

constexpr int kDigitBits = 11;
constexpr int64_t kBuckets = int64_t{1} << kDigitBits;
// Below this many positions a comparison sort beats clearing and scanning the count table.
constexpr int32_t kSmall = 64;

int bit_width(uint64_t x) {
  int bits = 0;
  for (; x != 0; x >>= 1) ++bits;
  return bits;
}

}  // namespace

template <typename Idx>
void sort_positions(const Idx* keys, int32_t n, int64_t rows, std::vector<int32_t>& out,
                    std::vector<int32_t>& scratch) {
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  const int bits = bit_width(static_cast<uint64_t>(std::max<int64_t>(rows - 1, 0)));
  if (n <= 1 || bits == 0) return;
  if (n < kSmall) {
    std::stable_sort(out.begin(), out.end(), [keys](int32_t a, int32_t b) { return keys[a] < keys[b]; });
    return;
  }
  scratch.resize(static_cast<size_t>(n));
  const int passes = (bits + kDigitBits - 1) / kDigitBits;
  // Pass p writes into `to`; the last pass must write into `out`, so an odd count starts there.
  int32_t* from = nullptr;  // the first pass reads positions in order
  int32_t* to = passes % 2 == 1 ? out.data() : scratch.data();
  int32_t* other = passes % 2 == 1 ? scratch.data() : out.data();
  std::array<int64_t, kBuckets> next{};
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * kDigitBits;
    auto digit = [&](int32_t position) {
      return static_cast<int64_t>((static_cast<uint64_t>(keys[position]) >> shift) & (kBuckets - 1));
    };
    next.fill(0);
    for (int32_t i = 0; i < n; ++i) ++next[digit(from != nullptr ? from[i] : i)];
    int64_t start = 0;
    for (auto& count : next) start += std::exchange(count, start);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t position = from != nullptr ? from[i] : i;
      to[next[digit(position)]++] = position;
    }
    from = to;
    std::swap(to, other);
  }
}

template <typename Idx>
void find_runs(const Idx* keys, const std::vector<int32_t>& sorted, std::vector<int64_t>& starts,
               std::vector<int64_t>& rows_of) {
  starts.clear();
  rows_of.clear();
  const auto n = static_cast<int64_t>(sorted.size());
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<int64_t>(keys[sorted[i]]);
    if (i == 0 || row != rows_of.back()) {
      starts.push_back(i);
      rows_of.push_back(row);
    }
  }
  starts.push_back(n);
}

template void sort_positions<int64_t>(const int64_t*, int32_t, int64_t, std::vector<int32_t>&, std::vector<int32_t>&);
template void sort_positions<int32_t>(const int32_t*, int32_t, int64_t, std::vector<int32_t>&, std::vector<int32_t>&);
template void find_runs<int64_t>(const int64_t*, const std::vector<int32_t>&, std::vector<int64_t>&,
                                 std::vector<int64_t>&);
template void find_runs<int32_t>(const int32_t*, const std::vector<int32_t>&, std::vector<int64_t>&,
                                 std::vector<int64_t>&);

}  // namespace ember::embedding_bag::detail
