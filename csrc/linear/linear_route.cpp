#include "linear/linear_route.h"

#include "linear/linear_swapped.h"
#include "onednn/onednn_common.h"
#include "skinny/skinny_matmul.h"
#include "tile_matmul/tile_matmul.h"

namespace ember::linear {
namespace {

// The caller's fp32 rules were measured on the Xeon and hold only where its fp32 matmul is MKL's on an Intel CPU,
// which takes MKL's fast small-matrix kernels (on the Zen 5 VM torch's fp32 kernel at 2-8 rows ran 2-7x slower
// than ember's: 768x768 at 2 rows 66 µs against 17). There it is faster for fp32 at these shapes: oneDNN's fp32
// matmul reads a single row no faster than torch, and below ~4M weights at 8 rows or fewer its per-call cost
// shows, more so on the weight in place, where it reorders slices of it on every call.
constexpr int64_t kFp32CallerRows = 1;
constexpr int64_t kFp32SmallRows = 8;
constexpr int64_t kFp32SmallWeight = int64_t{4} << 20;
// Row counts at which the caller's fp32 kernel matched or beat the skinny matmul on weights under 4M (BERT-base's)
// in two runs on the Xeon (0.88-0.94x at 2 rows, 0.89-1.04x at 8); 3 rows are taken as 4 are. Under 1M elements
// (768x768) it was as fast at every row count up to 8, and the module call around ember's kernel, a few
// microseconds more than nn.Linear's, then made it 0.87-0.92x the stock module at 1 row and 0.9-1.01x at 4.
constexpr int64_t kFp32TinyWeight = int64_t{1} << 20;
bool fp32_small_caller_rows(int64_t rows) { return rows == 2 || (rows >= 5 && rows <= 8); }
// oneDNN on a K-major weight in place (Hugging Face's Conv1D) lost to torch at up to 8 rows (0.8-0.96x in bf16,
// 0.3-0.66x in fp32 on the Xeon; in bf16 also on the Zen 5 VM at 4096x4096, 0.7x); the skinny matmul does not take
// it (its dot products run along rows of w).
constexpr int64_t kKMajorCallerRows = 8;
// oneDNN's bf16 matmul on an unpacked weight copies slices of it into the AMX layout on every call: from ~32M
// weights (64 MiB, more than the Xeon's caches) that costs what it saves (0.79-1.14x torch at 11008x4096 from 32
// rows, over two runs), and the caller's kernel runs instead. (Up to 32 rows such weights run on the skinny
// matmul's AMX path, 2.1-2.4x torch at 16-32 rows.)
constexpr int64_t kBf16InPlaceCallerWeight = int64_t{32} << 20;

}  // namespace

bool caller_is_faster(DType compute, int64_t rows, const TensorView& weight, bool in_place, bool caller_mkl_fp32) {
  if (compute == DType::f16) return false;  // torch has no fast f16 CPU matmul to hand a call to
  const bool mkl_fp32 = compute == DType::f32 && caller_mkl_fp32;
  const int64_t size = weight.numel();
  if (in_place && weight.stride(1) != 1) {
    if (rows <= kKMajorCallerRows && (compute == DType::bf16 || mkl_fp32)) return true;
  } else if (in_place && rows <= skinny::max_rows(compute)) {
    // The skinny matmul streams a row-major weight as fast as the caller's kernel or faster, except at these.
    return mkl_fp32 && (size < kFp32TinyWeight || (size < kFp32SmallWeight && fp32_small_caller_rows(rows)));
  }
  if (compute == DType::bf16) return in_place && size >= kBf16InPlaceCallerWeight;
  return mkl_fp32 && (rows <= kFp32CallerRows || (rows <= kFp32SmallRows && size < kFp32SmallWeight));
}

LinearKernel route_call(DType compute, const TensorView& x, const TensorView* weight, const TensorView& out,
                        const Epilogue& epilogue, const TensorView* residual, bool packed_for_tiles) {
  if (weight == nullptr) {
    // A packed copy, in oneDNN's layout, which the tile matmul reads too. For a batch-1 sequence its prefetch of
    // each thread's next panel gains where each layer's weights come from beyond L2: graph mode at batch 1 with and
    // without it, runs interleaved on the Xeon, BERT-base 2.21x / 2.21x eager against 1.99x / 2.06x, GPT-2 2.30x /
    // 2.22x against 2.21x / 2.15x, ViT-B/16 2.35x / 2.32x against 2.10x / 2.25x (benchmarks/results/
    // models-tiles-on-*, graph-without-tiles-*); its rows are tile_matmul.h's.
    const int64_t rows = x.size(0);
    if (packed_for_tiles && rows <= tile_matmul::kMaxFewRows && tile_matmul::few_rows_available(compute)) {
      return LinearKernel::few_rows;
    }
    const bool tiles = packed_for_tiles && tile_matmul::available(compute);
    return tiles && rows >= tile_matmul::kMinRows && rows <= tile_matmul::kMaxRows ? LinearKernel::tiles
                                                                                   : LinearKernel::onednn;
  }
  // A few rows: a stream down the weight's rows where they lie, which oneDNN would reorder on every call.
  if (skinny::takes(x, *weight)) return LinearKernel::skinny;
  // The transposed matmul sees what a primitive would: at most the add, when it comes before every activation.
  const TensorView* primitive_residual = onednn::primitive_adds(epilogue, residual) ? residual : nullptr;
  return swapped::takes(compute, x, *weight, out, primitive_residual) ? LinearKernel::swapped : LinearKernel::onednn;
}

}  // namespace ember::linear
