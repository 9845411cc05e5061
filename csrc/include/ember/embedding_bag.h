// Merged embedding bags: the bag lookups of several tables in one parallel pass, their gradients, and optimizer
// steps fused into the backward pass.
//
// A recommendation model looks up dozens of tables a batch. One call here covers all of them, so the tables share
// one fork/join and the threads balance over the whole batch's rows instead of one table at a time. The backward
// pass can apply SGD or Adagrad to the rows a batch touched as it computes their gradients: no gradient tensor of
// the table's size, dense or sparse, ever exists.
//
// Definitions, for one table with weight W [rows, dim], indices I [n] and B bags:
//   bag b covers positions [start_b, end_b): start_b = offsets[b]; end_b = offsets[b + 1], or for the last bag n
//   (or offsets[B] when include_last_offset: offsets then has B + 1 entries).
//   out[b] = sum over p in bag b of s_p * W[I[p]], where s_p is per_sample_weights[p] (mode sum, when given), 1
//   (mode sum) or 1 / (end_b - start_b) (mode mean). An empty bag gives zeros. Rows are accumulated in the
//   table's arithmetic type (float32 for float32 and bfloat16 weights, float64 for float64 ones) in position
//   order and the sum is rounded once to the output's dtype (W's).
//   The gradient of W is, for each row r that some position names, dW[r] = sum over the positions p with I[p] = r,
//   in increasing p, of s_p * grad_out[b(p)] (b(p): p's bag), in the arithmetic type. The order is fixed by the
//   positions, so results do not depend on the thread count; duplicate indices are summed, never raced.
//   The gradient of per_sample_weights is dpsw[p] = dot(grad_out[b(p)], W[I[p]]), in the arithmetic type.
// float64 tables (gradient checks, float64 references) run a scalar path in double on every machine.
//
// Fused updates apply to each touched row r, with g = dW[r] (rows no position names are not touched):
//   SGD:     w = w - lr * (g + weight_decay * w)
//   Adagrad: g = g + weight_decay * w;  sum = sum + g * g;  w = w - clr * (g / (sqrt(sum) + eps)),
//            clr = lr / (1 + (step - 1) * lr_decay), step being the table's count after this update's increment.
// These are torch.optim.SGD's and Adagrad's formulas on a coalesced sparse gradient (torch's own sparse paths refuse
// weight decay; here it applies to the touched rows only, as a sparse update can). Weights are float32, bfloat16
// (updated in float32, rounded to nearest even) or split-BF16 (a bfloat16 top half with an int16 bottom half,
// ember/bf16.h: joined, updated and split again, so the float32 master value is what trains); not float64.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::embedding_bag {

enum class Mode : uint8_t { sum, mean };

/// One table's part of a merged call. Every tensor is contiguous.
struct Table {
  TensorView weight;   // [rows, dim], float32, bfloat16 or float64
  TensorView indices;  // [n], int64 or int32
  TensorView offsets;  // [B] (or [B + 1] with include_last_offset), the dtype of indices; starts at 0, never falls
  std::optional<TensorView> per_sample_weights;  // [n], the arithmetic type (float32, float64 for float64 weights);
                                                 // mode sum only
};

struct Options {
  Mode mode = Mode::sum;
  bool include_last_offset = false;
};

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// out[t] = the bags of tables[t] ([B_t, dim_t], the dtype of the table's weight). Checked before anything is
/// written: the shapes and dtypes above, offsets starting at 0, non-decreasing and within n, every index a bag
/// uses within [0, rows) (IndexError), outputs sharing no memory with any input or each other.
void forward(const std::vector<Table>& tables, const std::vector<TensorView>& out, const Options& options);

/// One table's weight gradient as the rows it touches: `rows` ascending and unique, `values` [rows.size(), dim]
/// in the table's arithmetic type (float32, or float64 for a float64 table), row-major.
struct RowGradient {
  std::vector<int64_t> rows;
  std::variant<std::vector<float>, std::vector<double>> values;
};

/// The weight gradient of every table, given the gradient of its output (grad_outs[t]: [B_t, dim_t], the dtype
/// of the weight). Checked as forward is.
std::vector<RowGradient> backward(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                  const Options& options);

/// The gradient of each table's per_sample_weights: grad_psws[t], [n_t] in the arithmetic type, for each table that has
/// them (nullopt for one that has none). Positions no bag covers get 0. Mode sum only.
void per_sample_weights_backward(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                                 const std::vector<std::optional<TensorView>>& grad_psws, const Options& options);

struct SgdOptions {
  double lr = 0.01;
  double weight_decay = 0.0;
};

struct AdagradOptions {
  double lr = 0.01;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double eps = 1e-10;
};

/// What a fused update writes besides the weights, per table.
struct UpdateState {
  std::optional<TensorView> bottom;     // split-BF16: the int16 low halves of a bfloat16 weight, [rows, dim]
  std::optional<TensorView> state_sum;  // Adagrad: float32 [rows, dim]
  std::optional<TensorView> step;       // Adagrad: float32, one element; incremented by the update
};

/// Backward with the SGD step fused in: the weights (and bottoms) of the touched rows are updated in place. Every
/// check, the indices' range included, runs before the first write; options must be finite and >= 0.
void sgd_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                const std::vector<UpdateState>& states, const Options& options, const SgdOptions& sgd);

/// Backward with the Adagrad step fused in (state_sum and step required for every table).
void adagrad_update(const std::vector<Table>& tables, const std::vector<TensorView>& grad_outs,
                    const std::vector<UpdateState>& states, const Options& options, const AdagradOptions& adagrad);

}  // namespace ember::embedding_bag
