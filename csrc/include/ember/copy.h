// A strided copy: the data movement a graph makes between two kernels when a view cannot be read where it lies
// (`x.permute(...).contiguous()`, a `reshape` of a transposed tensor), as one step of a replayed segment
// (python/csrc/replay_binding.cpp) where torch's copy would cost a dispatcher round trip and a fresh allocation.
#pragma once

#include "ember/tensor_view.h"

namespace ember {

/// dst = src, element for element.
///   src: any dtype and sizes, any strides >= 0 (a stride of 0 repeats an element: an expanded view);
///   dst: src's dtype and sizes, holding each element once (dense, any order of dimensions), sharing no memory
///        with src.
/// Rows of the innermost dimension both tensors walk with unit stride are moved with memcpy, other elements one by
/// one; rows are split over the threads. Checked before anything is written.
void copy(const TensorView& src, const TensorView& dst);

}  // namespace ember
