// Per-ISA bodies of dropout (ember/dropout.h). Internal to ember_core: dropout.cpp picks one and runs it in
// parallel. Each works on elements [begin, end) of arrays x and y that start at element 0 of the definition (the
// element index is the generator's counter), with begin a multiple of 64 (a whole tile); y may be x.
// S is float for float32 tensors and uint16_t for the bit patterns of bfloat16 ones.
#pragma once

#include <cstdint>

namespace ember::dropout::kernels {

template <typename S>
using ApplyFn = void (*)(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);

template <typename S>
void apply_ref(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);
template <typename S>
void apply_avx2(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);
template <typename S>
void apply_avx512(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale);

}  // namespace ember::dropout::kernels
