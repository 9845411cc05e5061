// Random matrices for the tests of the matmul kernels: values exact in the dtype they are viewed as (so a float64
// reference sees what the kernel sees), rows optionally padded (a leading dimension larger than the row).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ember/bf16.h"
#include "ember/tensor_view.h"

namespace ember::testing {

inline float to_bf16_and_back(float x) { return bf16::widen(bf16::round_bits(bf16::float_bits(x))); }

struct Matrix {
  int64_t rows, cols, ld;
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<_Float16> f16;  // the compiler's binary16 (libgcc's conversions, not ember's)

  Matrix(int64_t r, int64_t c, DType dt, uint32_t seed, int64_t pad = 0) : rows(r), cols(c), ld(c + pad), dtype(dt) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    f32.resize(static_cast<size_t>(std::max<int64_t>(rows * ld, 1)));
    for (float& v : f32) v = dtype == DType::bf16 ? to_bf16_and_back(normal(rng)) : normal(rng);
    if (dtype == DType::f16) {
      f16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        f16[i] = static_cast<_Float16>(f32[i]);
        f32[i] = static_cast<float>(f16[i]);
      }
    }
    if (dtype == DType::bf16) {
      bf16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) bf16[i] = static_cast<uint16_t>(::ember::bf16::float_bits(f32[i]) >> 16);
    }
  }
  double at(int64_t r, int64_t c) const {
    if (dtype == DType::f16) return static_cast<double>(f16[r * ld + c]);
    return dtype == DType::bf16 ? ::ember::bf16::widen(bf16[r * ld + c]) : f32[r * ld + c];
  }
  /// Sets one element in both views (`value` should be exact in bf16 for a bf16 matrix).
  void set(int64_t r, int64_t c, float value) {
    f32[r * ld + c] = value;
    if (dtype == DType::bf16) bf16[r * ld + c] = static_cast<uint16_t>(::ember::bf16::float_bits(value) >> 16);
    if (dtype == DType::f16) f16[r * ld + c] = static_cast<_Float16>(value);
  }
  TensorView view() {
    void* data = dtype == DType::bf16  ? static_cast<void*>(bf16.data())
                 : dtype == DType::f16 ? static_cast<void*>(f16.data())
                                       : static_cast<void*>(f32.data());
    const int64_t sizes[2] = {rows, cols}, strides[2] = {ld, 1};
    return TensorView(data, dtype, sizes, strides, 2);
  }
};

}  // namespace ember::testing
