// Per-ISA bodies of the skinny matmul (skinny_matmul.h). Internal to ember_core: skinny_matmul.cpp picks one and
// runs it over slices of the weight's rows in parallel.
//
// Each computes y[i * ldy + j] = sum_k x[i * ldx + k] * w[(n0 + j) * ldw + k] in fp32 for i < m (1 <= m <=
// skinny::kMaxRows) and j < n1 - n0: rows of x against rows of w, both with unit stride along k. S is float for
// float32 and uint16_t for the bit patterns of bfloat16 (x and w have the same dtype). The sum runs over k in one
// fixed order, so its value does not depend on how the rows of w are split between threads.
#pragma once

#include <cstdint>

namespace ember::skinny::kernels {

template <typename S>
using DotRowsFn = void (*)(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0,
                           int64_t n1, float* y, int64_t ldy);

template <typename S>
void dot_rows_ref(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                  float* y, int64_t ldy);
template <typename S>
void dot_rows_avx2(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                   float* y, int64_t ldy);
template <typename S>
void dot_rows_avx512(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0,
                     int64_t n1, float* y, int64_t ldy);
// bf16 only: vdpbf16ps multiplies pairs of bf16 and adds both products to fp32 lanes.
void dot_rows_avx512_bf16(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                          int64_t n0, int64_t n1, float* y, int64_t ldy);

}  // namespace ember::skinny::kernels
