// Rotary position embedding in the rotate-half form of GPT-NeoX and Hugging Face's Llama, Mistral, Qwen2 and their
// kin: with h = D / 2 and each row x of the last dimension,
//
//   out[i]     = x[i]     · cos[i]     - x[i + h] · sin[i]        (i < h)
//   out[i + h] = x[i + h] · cos[i + h] + x[i]     · sin[i + h]
//
// which is `x * cos + cat(-x[..., h:], x[..., :h]) * sin` in one pass, in float32 with one rounding on output
// (torch rounds each product and the sum to a bf16 input's dtype: under bf16, results differ by those roundings).
// Rows are independent: results do not depend on the thread count.
#pragma once

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::rope {

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// out = rotate_half(x, cos, sin) as above.
///   x: [B, H, L, D] (D even), float32 or bfloat16, the last dimension of stride 1, any other strides;
///   cos, sin: one dtype, float32 or bfloat16, 1 to 4 dimensions broadcasting to x's shape (aligned right, size-1
///      dimensions broadcast), the last of stride 1 and of size R, the features rotated: D, or an even R < D for a
///      partial rotary embedding (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor), which rotates x's first R
///      features in halves of R / 2 and copies the rest;
///   out: x's shape, float32 or bfloat16, holding each element once (dense, any order of dimensions), sharing no
///      memory with the inputs.
/// Checked before anything is written.
void rotate_half(const TensorView& x, const TensorView& cos, const TensorView& sin, const TensorView& out);

}  // namespace ember::rope
