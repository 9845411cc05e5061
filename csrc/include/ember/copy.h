// The data movement a graph makes between two kernels, as steps of a replayed segment (python/csrc/replay_binding.cpp)
// where torch's copies would cost a dispatcher round trip and a fresh allocation each: a strided copy (a view that
// cannot be read where it lies, `x.permute(...).contiguous()`, a `reshape` of a transposed tensor, each input of a
// `cat`, a padded input inside its zeroed border) and a gather of rows (Swin's rolled window partition).
#pragma once

#include "ember/tensor_view.h"

namespace ember {

/// dst = src, element for element.
///   src: any dtype and sizes, any strides >= 0 (a stride of 0 repeats an element: an expanded view);
///   dst: src's dtype and sizes, no two of its elements at one place (dense, or a part of a larger tensor: one input
///        of a `cat`, written into its slice of the result), sharing no memory with src.
/// Runs along the innermost dimension both tensors walk with unit stride are moved with memcpy, other elements one
/// by one; the elements are split over the threads. Checked before anything is written.
void copy(const TensorView& src, const TensorView& dst);

/// dst = 0 (every byte of every element: 0.0, 0, false): the border of a constant pad before the copy of its input.
///   dst: any dtype and sizes, no two of its elements at one place. Checked before anything is written.
void zero(const TensorView& dst);

/// out[i, :] = src[rows[i], :]: the rows a chain of data movement gathers (a window partition after a roll, as
/// python/ember/_optimize/graph/rearrangement_node.py plans it).
///   src: [R, W], any dtype, the last dimension of stride 1, rows at any stride >= W;
///   rows: [N], int64, each in [0, R);
///   out: [N, W], src's dtype, contiguous, sharing no memory with src or rows.
/// Checked before anything is written (every index too).
void gather_rows(const TensorView& src, const TensorView& rows, const TensorView& out);

}  // namespace ember
