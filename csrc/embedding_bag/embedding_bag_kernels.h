// Per-ISA bodies of the merged embedding bags (ember/embedding_bag.h). Internal to ember_core: embedding_bag.cpp
// checks the arguments, splits the work and runs these in parallel; each body handles a range of one table's bags
// (pooling, per-sample-weight gradients) or of its row segments (gradients and fused updates).
//
// W is float for float32 weights, uint16_t for the bit patterns of bfloat16 ones and double for float64 ones; Idx
// is int32_t or int64_t. Every pointer is to a contiguous row-major array; indices have been checked to lie within
// [0, rows).
#pragma once

#include <cstdint>
#include "ember/tensor_view.h"

namespace ember::embedding_bag::kernels {

/// Which lines of a row the pooling loop prefetches ahead (bag_units.cpp's row_prefetch says which, per
/// machine). A choice of two, not a count: the bodies are compiled for each, so the loop over a row's vectors is
/// straight-line code (a run-time count put a compare and branch after every load: 15-25% slower on Zen 5).
enum class RowPrefetch : uint8_t {
  every_line,  // all of them, one after each line's load
  first_line,  // the first only; the L2 streamer follows the row
};

/// One table's bags. Bag b covers positions [offsets[b], b + 1 < bags ? offsets[b + 1] : last_end).
template <typename W, typename Idx>
struct BagArgs {
  const W* weight = nullptr;  // [rows, dim]
  int64_t dim = 0;
  const Idx* indices = nullptr;  // [n]
  const Idx* offsets = nullptr;
  int64_t bags = 0;
  int64_t last_end = 0;
  const Arithmetic<W>* per_sample_weights = nullptr;  // [n] or null
  RowPrefetch prefetch = RowPrefetch::every_line;     // pooling
  bool mean = false;
  W* out = nullptr;                          // pooling: [bags, dim]
  const W* grad_out = nullptr;               // per-sample-weight gradient: [bags, dim]
  Arithmetic<W>* grad_per_sample = nullptr;  // per-sample-weight gradient: [n]

  int64_t bag_begin(int64_t b) const { return static_cast<int64_t>(offsets[b]); }
  int64_t bag_end(int64_t b) const { return b + 1 < bags ? static_cast<int64_t>(offsets[b + 1]) : last_end; }
};

template <typename W, typename Idx>
using PoolFn = void (*)(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end);
template <typename W, typename Idx>
using PerSampleGradFn = void (*)(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end);

/// What a row-segment body does with a row's summed gradient g.
enum class RowOp : uint8_t {
  gradient,  // values[segment] = g
  sgd,       // w = w + neg_lr * (g + weight_decay * w)
  adagrad,   // g += weight_decay * w; sum += g * g; w = w + neg_lr * (g / (sqrt(sum) + eps))
};

/// One table's rows as sorted segments: segment s is row seg_row[s], named by the positions
/// sorted_pos[seg_start[s] .. seg_start[s + 1]) (increasing within the segment).
template <typename W>
struct RowArgs {
  int64_t dim = 0;
  const W* grad_out = nullptr;  // [bags, dim]
  const int32_t* sorted_pos = nullptr;
  int64_t positions = 0;                              // sorted_pos's length
  const int32_t* bag_of = nullptr;                    // [n]: the bag of each position
  const Arithmetic<W>* per_sample_weights = nullptr;  // [n] or null
  const Arithmetic<W>* inv_len = nullptr;             // mean: [bags], 1 / the bag's length; null for sum
  const int64_t* seg_start = nullptr;
  const int64_t* seg_row = nullptr;
  RowOp op = RowOp::gradient;
  Arithmetic<W>* values = nullptr;     // gradient: [segments, dim]
  W* weight = nullptr;                 // updates: [rows, dim]
  uint16_t* bottom = nullptr;          // split-BF16 low halves (W = uint16_t), or null
  Arithmetic<W>* state_sum = nullptr;  // adagrad: [rows, dim]
  float neg_lr = 0.0f;
  float weight_decay = 0.0f;
  float eps = 0.0f;
};

template <typename W>
using RowFn = void (*)(const RowArgs<W>& a, int64_t segment_begin, int64_t segment_end);

#define EMBER_EMBEDDING_BAG_DECLARE(isa)                                                    \
  template <typename W, typename Idx>                                                       \
  void pool_##isa(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end);            \
  template <typename W, typename Idx>                                                       \
  void per_sample_grad_##isa(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end); \
  template <typename W>                                                                     \
  void rows_##isa(const RowArgs<W>& a, int64_t segment_begin, int64_t segment_end);
EMBER_EMBEDDING_BAG_DECLARE(ref)
EMBER_EMBEDDING_BAG_DECLARE(avx2)
EMBER_EMBEDDING_BAG_DECLARE(avx512)
#undef EMBER_EMBEDDING_BAG_DECLARE

// float64 tables: the reference body in double (embedding_bag_kernels.cpp, ref compilation), on every machine.
template <typename Idx>
void pool_f64(const BagArgs<double, Idx>& a, int64_t bag_begin, int64_t bag_end);
template <typename Idx>
void per_sample_grad_f64(const BagArgs<double, Idx>& a, int64_t bag_begin, int64_t bag_end);
void rows_f64(const RowArgs<double>& a, int64_t segment_begin, int64_t segment_end);

}  // namespace ember::embedding_bag::kernels
