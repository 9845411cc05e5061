// An fp32 Linear on a weight in place, computed transposed: outᵀ = W xᵀ.
//
// Why: on the weight where it lies, the plain matmul's B is Wᵀ with strides {1, K}, which oneDNN's brgemm copies
// into its blocked layout on every call, transposing as it goes. Inside a model the weights arrive cold, one
// layer after another, and that transposing copy reads them slower than torch reads its own. Swapped, W is the
// matmul's A, which brgemm reads as it lies (row-major, any row stride), and the operand it copies is xᵀ, a few
// rows. The product comes out transposed, [N, M], into a buffer of the calling thread, and a last pass writes it
// into out, adding the residual.
//
// The bias is that buffer's starting value, added by a sum post-op. The residual [M, N] is added in the
// transposing pass; the activations run after the call, as on the plain path (onednn::EpilogueSplit).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <vector>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::onednn {
class BoundPrimitive;
}  // namespace ember::onednn

namespace ember::linear::swapped {

// Where it pays (the Xeon, 16 threads; benchmarks/results/linear-intel-*.md; speedups over torch within a run,
// three runs): on weights wider than tall, and on weights too big for the caches, from 9 rows (where the skinny
// matmul stops) to 256. Warm, at 16 rows: 768x3072 2.9-3.4x against 2.2x on the plain path, 11008x4096 3.1-4.0x
// against 2.6x, 4096x4096 2.7-3.5x against 2.7x. Cold (cycling 256 MB of weights), at 128 rows: 768x3072 644 us
// against 803. On cache-sized weights as tall as wide or taller it loses warm (768x768: 0.91-0.95x against
// 1.07-1.22x; 3072x768 at 32 rows: 265 us against 189): xᵀ's copy then costs about what the weight's does, and
// the transposing pass is extra. At 512 rows it breaks even.
constexpr int64_t kMinRows = 9;
constexpr int64_t kMaxRows = 256;
constexpr int64_t kBeyondCaches = 16 << 20;  // weight elements (64 MiB in fp32)

/// Whether a call of these arguments runs swapped: fp32 throughout, a row-major weight (unit stride along K) of
/// at least 16 x 16 that is wider than tall or has kBeyondCaches elements, and kMinRows..kMaxRows rows.
/// `residual` is the one the primitive adds (onednn::primitive_adds), or null; the activations run after the call.
bool takes(DType compute, const TensorView& x, const TensorView& weight, const TensorView& out,
           const TensorView* residual);

/// The transposed matmul for `takes` arguments, adding the bias (when `bias`) as a sum post-op onto the product
/// buffer's starting value. Throws dnnl::error when oneDNN has no implementation.
dnnl::matmul::primitive_desc make_pd(const TensorView& x, const TensorView& weight, bool bias);

/// out = x Wᵀ + bias [+ residual] through `prim` (made from a make_pd descriptor). The caller has
/// checked the arguments and set the thread budget.
void run(const onednn::BoundPrimitive& prim, const TensorView& x, const TensorView& weight,
         const std::vector<float>& bias, const TensorView& out, const TensorView* residual);

}  // namespace ember::linear::swapped
