// A [B, H, L, D] operand of the attention and rotary-embedding tests: random values exact in their dtype (so a float64
// reference sees what the kernel sees), laid out row-major or as [B, L, H, D] memory, as a projection split into
// heads lays it out.
#pragma once

#include <cstdint>

#include "ember/tensor_view.h"
#include "random_matrix.h"

namespace ember::testing {

// A [B, H, L, D] view over a flat random buffer: row-major, or [B, L, H, D] memory seen as [B, H, L, D].
struct Heads {
  int64_t b, h, l, d;
  bool sequence_major;
  Matrix storage;
  Heads(int64_t b_, int64_t h_, int64_t l_, int64_t d_, DType dtype, uint32_t seed, bool seq_major = false)
      : b(b_), h(h_), l(l_), d(d_), sequence_major(seq_major), storage(1, b_ * h_ * l_ * d_, dtype, seed) {}
  int64_t offset(int64_t bi, int64_t hi, int64_t li, int64_t di) const {
    return sequence_major ? ((bi * l + li) * h + hi) * d + di : ((bi * h + hi) * l + li) * d + di;
  }
  double at(int64_t bi, int64_t hi, int64_t li, int64_t di) const { return storage.at(0, offset(bi, hi, li, di)); }
  TensorView view() {
    const int64_t sizes[4] = {b, h, l, d};
    const int64_t strides[4] = {h * l * d, sequence_major ? d : l * d, sequence_major ? h * d : d, 1};
    void* data =
        storage.dtype == DType::bf16 ? static_cast<void*>(storage.bf16.data()) : static_cast<void*>(storage.f32.data());
    return TensorView(data, storage.dtype, sizes, strides, 4);
  }
};

}  // namespace ember::testing
