// Per-ISA bodies of ember/rope.h over a range of rows; rope.cpp checks the arguments and shares the rows out.
#pragma once

#include <cstdint>

namespace ember::rope::kernels {

// A [B, H, L, D] operand: row (b, h, l) at data + b*sb + h*sh + l*sl, its D elements contiguous. bf16: uint16_t
// storage (else float). Broadcast dimensions have stride 0.
template <typename P>
struct Rows4 {
  P* data = nullptr;
  int64_t sb = 0, sh = 0, sl = 0;
  bool bf16 = false;
};

struct RopeArgs {
  int64_t heads = 0, length = 0, dim = 0;
  int64_t rotary = 0;  // the features rotated (even, <= dim); the rest are copied
  // Rows are numbered in x's memory order: (b · heads + h) · length + l, or with `heads_inner` (a query in
  // [b, l, h, d] memory, seen as [b, h, l, d]) (b · length + l) · heads + h.
  bool heads_inner = false;
  Rows4<const void> x, cos, sin;
  Rows4<void> out;
};

using RopeFn = void (*)(const RopeArgs& a, int64_t row_begin, int64_t row_end);
void rotate_half_ref(const RopeArgs& a, int64_t row_begin, int64_t row_end);
void rotate_half_avx2(const RopeArgs& a, int64_t row_begin, int64_t row_end);
void rotate_half_avx512(const RopeArgs& a, int64_t row_begin, int64_t row_end);

}  // namespace ember::rope::kernels
