// Normalisation layers whose statistics are fixed: a per-channel affine map.
//
// Frozen batch norm (torchvision.ops.FrozenBatchNorm2d, the batch norm of detection backbones, whose statistics
// never update): y = x * scale[c] + shift[c] with, in float32 as torchvision computes them (in float64 for float64
// x and buffers, on a scalar path that every machine runs),
//   scale = weight * rsqrt(running_var + eps),  shift = bias - running_mean * scale,
// and c the index along dimension 1. Its gradient is grad_x = grad_y * scale[c]; the buffers get none.
// x may be laid out row-major (N, C, spatial...) or channels-last (C innermost): the kernel runs over the memory
// as it is, vectorized along the spatial extent or along the channels. Results do not depend on the thread count.
#pragma once

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::norm {

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// y = frozen_batch_norm(x). x: float32, bfloat16 or float64, at least 2-D ([N, C, ...]), contiguous or
/// channels-last (dimension 1 of stride 1, the others dense); weight, bias, running_mean, running_var: [C], float32
/// (float64 for float64 x); eps finite and >= 0; out: x's shape and strides, float32 or x's dtype (float64 for
/// float64 x), x itself (same dtype) or sharing no memory with the inputs.
/// Checked before anything is written.
void frozen_batch_norm(const TensorView& x, const TensorView& weight, const TensorView& bias,
                       const TensorView& running_mean, const TensorView& running_var, double eps,
                       const TensorView& out);

/// grad_x = grad_y * scale[c]: grad_y as x above; grad_x of its shape and strides, float32 or its dtype (float64
/// for float64 grad_y).
void frozen_batch_norm_backward(const TensorView& grad_y, const TensorView& weight, const TensorView& running_var,
                                double eps, const TensorView& grad_x);

}  // namespace ember::norm
