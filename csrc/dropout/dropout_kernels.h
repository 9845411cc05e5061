// Dropout's kernels, one per ISA (ember/dropout.h). Internal to ember_core: dropout.cpp picks one and runs it in
// parallel. Each works on elements [begin, end) of arrays x and y that start at element 0 of the definition (the
// element index is the generator's counter), with begin a multiple of 64 (a whole tile); y may be x.
// S is float for float32 tensors and uint16_t for the bit patterns of bfloat16 ones.
#pragma once

#include <cstdint>

namespace ember::dropout::kernels {

template <typename S>
using ApplyFn = void (*)(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);

// One per ISA (dropout_kernels.cpp, compiled for each by ember_kernel_family).
#define EMBER_DROPOUT_DECLARE_KERNELS(isa) \
  template <typename S>                    \
  void apply_##isa(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);
EMBER_DROPOUT_DECLARE_KERNELS(ref)
EMBER_DROPOUT_DECLARE_KERNELS(avx2)
EMBER_DROPOUT_DECLARE_KERNELS(avx512)
#undef EMBER_DROPOUT_DECLARE_KERNELS

}  // namespace ember::dropout::kernels
