// Normalisation layers: those whose statistics are fixed (a per-channel affine map), and the row normalisations of
// transformers (LayerNorm, RMSNorm) with the residual add before them fused in.
//
// Frozen batch norm (torchvision.ops.FrozenBatchNorm2d, the batch norm of detection backbones, whose statistics
// never update): y = x * scale[c] + shift[c] with, in float32 as torchvision computes them (in float64 for float64
// x and buffers, on a scalar path that every machine runs),
//   scale = weight * rsqrt(running_var + eps),  shift = bias - running_mean * scale,
// and c the index along dimension 1. Its gradient is grad_x = grad_y * scale[c]; the buffers get none.
// x may be laid out row-major (N, C, spatial...) or channels-last (C innermost): the kernel runs over the memory
// as it is, vectorized along the spatial extent or along the channels. Results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::norm {

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// y = frozen_batch_norm(x). x: float32, bfloat16 or float64, at least 2-D ([N, C, ...]), contiguous or
/// channels-last (dimension 1 of stride 1, the others dense); weight, bias, running_mean, running_var: [C], float32
/// (float64 for float64 x); eps finite and >= 0; out: x's shape and strides, float32 or x's dtype (float64 for
/// float64 x), x itself (same dtype) or sharing no memory with the inputs.
/// relu (float32 and bfloat16 x): max(y, 0) after, NaN kept (an eval-mode BatchNorm and the ReLU after it in one
/// pass: graph mode's pre-activation blocks).
/// Checked before anything is written.
void frozen_batch_norm(const TensorView& x, const TensorView& weight, const TensorView& bias,
                       const TensorView& running_mean, const TensorView& running_var, double eps, const TensorView& out,
                       bool relu = false);

/// grad_x = grad_y * scale[c]: grad_y as x above; grad_x of its shape and strides, float32 or its dtype (float64
/// for float64 grad_y).
void frozen_batch_norm_backward(const TensorView& grad_y, const TensorView& weight, const TensorView& running_var,
                                double eps, const TensorView& grad_x);

/// The statistics a row normalisation divides by.
enum class RowNorm : uint8_t {
  layer,  // torch.nn.LayerNorm: (h - mean(h)) * rsqrt(var(h) + eps), the variance biased
  rms,    // torch.nn.RMSNorm, Hugging Face's LlamaRMSNorm and T5LayerNorm: h * rsqrt(mean(h²) + eps)
};

/// out = normalize(h) * weight + bias over the last dimension, with h = x + residual (the residual add before a
/// transformer's norm, fused in: the sum is read once from memory) or h = x. Statistics and arithmetic in float32:
/// the mean as the row's first element plus the mean of the differences from it, then the variance about it (so a
/// row far from zero keeps its spread); one rounding on output. h is float32 when x or
/// residual is, else bfloat16, rounded as torch's add rounds it before the norm reads it; sum_out (given only with
/// a residual) receives it: a pre-norm model's next residual. RMSNorm takes no bias.
///   x, residual: float32 or bfloat16, at least 1-D, the last dimension of stride 1 and the leading ones flattening
///                into rows (ember::TensorView::as_matrix); residual of x's shape;
///   weight, bias: [cols] contiguous, float32 or bfloat16 (both the same), or null for none;
///   out: x's shape, float32 or bfloat16; sum_out: x's shape and h's dtype. Outputs are written as rows: the last
///                dimension of stride 1, distinct rows apart.
///   out_bf16: with a float32 out, the same result rounded to bfloat16 besides (what the bf16 layers reading the
///                result take: one pass writes both, where each layer would round it again); out's shape.
/// An output may be an input itself (the same memory, dtype and strides: in place) or share no memory with any
/// input; the outputs share none. Rows are independent: results do not depend on the thread count.
/// Checked before anything is written.
void row_norm(RowNorm kind, const TensorView& x, const TensorView* residual, const TensorView* weight,
              const TensorView* bias, double eps, const TensorView& out, const TensorView* sum_out = nullptr,
              const TensorView* out_bf16 = nullptr);

}  // namespace ember::norm
