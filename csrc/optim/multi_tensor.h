// Splitting the elements of many tensors evenly across the thread budget, in one parallel region.
//
// The tensors are laid end to end in a virtual index space, each padded to a multiple of kSegmentAlign
// elements, and parallel_for cuts that space into contiguous chunks on kSegmentAlign boundaries. Every piece a
// chunk gets of a tensor therefore starts at a multiple of kSegmentAlign within that tensor, so a vector loop over
// the piece treats each element (full vector or tail) exactly as it would over the whole tensor: results do not
// depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::optim::detail {

inline constexpr int64_t kSegmentAlign = 64;

/// Calls body(slot, begin, end) for every piece [begin, end) of every slot's [0, numels[slot]), in parallel.
/// A slot's pieces start at multiples of kSegmentAlign; empty slots are skipped.
template <typename Body>
void for_each_segment(const std::vector<int64_t>& numels, int64_t grain, Body&& body);

/// Elements per block of the reductions (norms): each tensor is cut into blocks of this size from its start,
/// whatever the thread count, and a block's partial sum depends only on its data; the sums of a tensor's blocks
/// are then added in block order, so norms (and everything computed from them) are identical for any thread count.
inline constexpr int64_t kNormBlock = 4096;

/// Calls body(slot, block, begin, end) for every block of every slot, in parallel; `block` numbers the blocks
/// of all slots consecutively, slot after slot. Returns, per slot, the number of its first block (and one past
/// the last slot's last block at the end).
template <typename Body>
std::vector<int64_t> for_each_block(const std::vector<int64_t>& numels, int64_t grain_blocks, Body&& body);

/// Cuts slots [0, numels.size()) into runs of consecutive slots whose elements, at `bytes_per_element`, add up to at
/// most `budget_bytes` (a slot larger than that is a run of its own), and calls body(first, last) for each run, in
/// order, from the calling thread. A two-pass optimizer runs both passes over one run before the next: the second
/// pass then reads what the first left in the cache instead of memory.
template <typename Body>
void for_each_cache_run(const std::vector<int64_t>& numels, int64_t bytes_per_element, int64_t budget_bytes,
                        Body&& body);

}  // namespace ember::optim::detail

#include "multi_tensor_impl.h"
