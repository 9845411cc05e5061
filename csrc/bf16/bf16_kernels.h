// Per-ISA bodies of the bf16 conversions, on one contiguous chunk each. Internal to ember_core: bf16_convert.cpp
// picks one and runs it in parallel. Each ISA's file is compiled with that ISA's flags only, and includes nothing
// but this header and intrinsics, so no inline function compiled with wide-vector flags can leak into code that
// runs on a smaller CPU.
#pragma once

#include <cstdint>

namespace ember::bf16::kernels {

// `stream`: the caller expects the outputs not to be read again soon (the whole call moves more than the
// last-level cache holds), so paths that can write them with non-temporal stores do.
using SplitFn = void (*)(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream);
using JoinFn = void (*)(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream);
using RoundFn = void (*)(const float* src, uint16_t* dst, int64_t n, bool stream);

void split_ref(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream);
void join_ref(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream);
void round_ref(const float* src, uint16_t* dst, int64_t n, bool stream);

void split_avx2(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream);
void join_avx2(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream);
void round_avx2(const float* src, uint16_t* dst, int64_t n, bool stream);

void split_avx512(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool stream);
void join_avx512(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool stream);
void round_avx512(const float* src, uint16_t* dst, int64_t n, bool stream);

void round_avx512_bf16(const float* src, uint16_t* dst, int64_t n, bool stream);

}  // namespace ember::bf16::kernels
