// DLRM's dot interaction: the pairwise dot products of a sample's feature vectors, beside its dense features.
//
// For inputs x_0 (the dense features, after the bottom MLP) and x_1 .. x_T (one pooled embedding per table), each
// [B, D], sample b's output row is
//   out[b] = [ x_0[b], z_10, z_20, z_21, z_30, ..., z_T(T-1) ]      with z_ij = dot(x_i[b], x_j[b]), i > j,
// of D + (T + 1) T / 2 values: the strict lower triangle of X Xᵀ row by row, as DLRM's
// `Z[:, tril_indices(n, n, -1)]` orders it. Gradients, given g = grad_out[b]:
//   grad x_i[b] = [i == 0] g[:D] + sum over j != i of g_(max(i,j), min(i,j)) x_j[b].
// The torch composite (cat, bmm, index, cat) materialises the [B, T + 1, D] stack and the full [B, T + 1, T + 1]
// product; this reads each vector once a sample and computes only the triangle.
//
// Dots accumulate in float32 in a fixed order (results do not depend on the thread count); bfloat16 inputs are
// widened exactly and each output rounded once. float64 inputs (gradient checks, float64 references) run a scalar
// path in double on every machine.
#pragma once

#include <vector>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::interaction {

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// The number of output columns for `inputs` vectors (dense included) of width `dim`.
int64_t output_width(int64_t inputs, int64_t dim) noexcept;

/// out = the interaction of `inputs` (at least one; each [B, D] contiguous, one dtype: float32, bfloat16 or float64);
/// out [B, output_width] of that dtype, contiguous, sharing no memory with the inputs. Checked before anything is
/// written.
void forward(const std::vector<TensorView>& inputs, const TensorView& out);

/// grad_inputs[i] = the gradient of inputs[i] given grad_out ([B, output_width], the inputs' dtype); each
/// grad_inputs[i] of its input's shape and dtype, contiguous, sharing no memory with anything else of the call.
void backward(const std::vector<TensorView>& inputs, const TensorView& grad_out,
              const std::vector<TensorView>& grad_inputs);

}  // namespace ember::interaction
