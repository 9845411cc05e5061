#pragma once

#include <algorithm>

#include "ember/parallel.h"

namespace ember::optim::detail {

template <typename Body>
void for_each_segment(const std::vector<int64_t>& numels, int64_t grain, Body&& body) {
  // offsets[i]: where slot i starts in the padded index space.
  std::vector<int64_t> offsets(numels.size() + 1, 0);
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t padded = (numels[i] + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
    offsets[i + 1] = offsets[i] + padded;
  }
  const int64_t total = offsets.back();
  parallel_for(total, grain, kSegmentAlign, [&](int64_t, int64_t begin, int64_t end) {
    // The first slot whose padded range reaches past `begin`.
    size_t slot = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin()) - 1;
    for (; slot < numels.size() && offsets[slot] < end; ++slot) {
      const int64_t lo = std::max(begin, offsets[slot]) - offsets[slot];
      const int64_t hi = std::min(end - offsets[slot], numels[slot]);
      if (lo < hi) body(slot, lo, hi);
    }
  });
}

template <typename Body>
std::vector<int64_t> for_each_block(const std::vector<int64_t>& numels, int64_t grain_blocks, Body&& body) {
  std::vector<int64_t> first(numels.size() + 1, 0);
  for (size_t i = 0; i < numels.size(); ++i) first[i + 1] = first[i] + (numels[i] + kNormBlock - 1) / kNormBlock;
  parallel_for(first.back(), grain_blocks, 1, [&](int64_t, int64_t b0, int64_t b1) {
    size_t slot = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin()) - 1;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[slot + 1]) ++slot;
      const int64_t begin = (b - first[slot]) * kNormBlock;
      body(slot, b, begin, std::min(begin + kNormBlock, numels[slot]));
    }
  });
  return first;
}

template <typename Body>
void for_each_cache_run(const std::vector<int64_t>& numels, int64_t bytes_per_element, int64_t budget_bytes,
                        Body&& body) {
  size_t first = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t slot_bytes = numels[i] * bytes_per_element;
    if (i > first && bytes + slot_bytes > budget_bytes) {
      body(first, i);
      first = i;
      bytes = 0;
    }
    bytes += slot_bytes;
  }
  if (first < numels.size()) body(first, numels.size());
}

}  // namespace ember::optim::detail
