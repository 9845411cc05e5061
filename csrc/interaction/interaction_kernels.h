// Per-ISA bodies of the dot interaction (ember/interaction.h), each over samples [begin, end). W is float for float32
// tensors, uint16_t for the bit patterns of bfloat16 ones and double for float64 ones. inputs[i] points at input i's
// [B, dim] rows.
#pragma once

#include <cstdint>

namespace ember::interaction::kernels {

template <typename W>
struct Args {
  const W* const* inputs = nullptr;  // n pointers
  int n = 0;
  int64_t dim = 0;
  W* out = nullptr;                 // forward: [B, width]
  const W* grad_out = nullptr;      // backward: [B, width]
  W* const* grad_inputs = nullptr;  // backward: n pointers
  int64_t width = 0;
};

template <typename W>
using Fn = void (*)(const Args<W>& a, int64_t begin, int64_t end);

#define EMBER_INTERACTION_DECLARE(isa)                              \
  template <typename W>                                             \
  void forward_##isa(const Args<W>& a, int64_t begin, int64_t end); \
  template <typename W>                                             \
  void backward_##isa(const Args<W>& a, int64_t begin, int64_t end);
EMBER_INTERACTION_DECLARE(ref)
EMBER_INTERACTION_DECLARE(avx2)
EMBER_INTERACTION_DECLARE(avx512)
#undef EMBER_INTERACTION_DECLARE

// bfloat16 forward through vdpbf16ps (interaction_avx512_bf16.cpp).
void forward_avx512_bf16(const Args<uint16_t>& a, int64_t begin, int64_t end);

// float64: the reference body in double (interaction_kernels.cpp, ref compilation), on every machine.
void forward_f64(const Args<double>& a, int64_t begin, int64_t end);
void backward_f64(const Args<double>& a, int64_t begin, int64_t end);

}  // namespace ember::interaction::kernels
