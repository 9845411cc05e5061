// What a kernel translation unit is compiled for. A kernel family's source (csrc/<family>/<family>_kernels.cpp) is
// compiled once per ISA by ember_kernel_family (cmake/EmberIsa.cmake), which defines EMBER_KERNEL_ISA (ref, avx2,
// avx512, avx512_bf16 or amx) and gives that compilation the ISA's flags, as ATen builds its CPU_CAPABILITY kernels.
// The source names its entry points EMBER_KERNEL(name), which becomes name_<isa>: one body, one definition per ISA,
// and no file per ISA to keep in step.
#pragma once

#ifndef EMBER_KERNEL_ISA
#error "a kernel source is compiled through ember_kernel_family (cmake/EmberIsa.cmake), which sets EMBER_KERNEL_ISA"
#endif

#define EMBER_KERNEL_CAT_(a, b) a##_##b
#define EMBER_KERNEL_CAT(a, b) EMBER_KERNEL_CAT_(a, b)
/// `name` with the suffix of the ISA being compiled: EMBER_KERNEL(adam) is adam_avx512 in the avx512 compilation.
#define EMBER_KERNEL(name) EMBER_KERNEL_CAT(name, EMBER_KERNEL_ISA)

// The level as a number, for #if: 0 ref, 1 avx2, 2 avx512, 3 avx512_bf16, 4 amx.
#define EMBER_KERNEL_LEVEL_ref 0
#define EMBER_KERNEL_LEVEL_avx2 1
#define EMBER_KERNEL_LEVEL_avx512 2
#define EMBER_KERNEL_LEVEL_avx512_bf16 3
#define EMBER_KERNEL_LEVEL_amx 4
#define EMBER_KERNEL_LEVEL_OF_(isa) EMBER_KERNEL_LEVEL_##isa
#define EMBER_KERNEL_LEVEL_OF(isa) EMBER_KERNEL_LEVEL_OF_(isa)
#define EMBER_KERNEL_LEVEL EMBER_KERNEL_LEVEL_OF(EMBER_KERNEL_ISA)

#if EMBER_KERNEL_LEVEL > 0
#include <immintrin.h>
#endif
