#include "core/magnitude.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ember/bf16.h"
#include "ember/parallel.h"

namespace ember {
namespace {

// binary16's exact conversion, the one every kernel's scalar path uses (ScalarF's loads of Half).
// clang-format off
#include "simd/simd_scalar.inl"
// clang-format on

// A chunk of the scan: enough elements that a fork and join (a few microseconds) is small beside reading them.
constexpr int64_t kChunkElements = int64_t{1} << 15;

// The largest magnitude's bit pattern over n elements: the sign bit cleared, an unsigned maximum. A plain loop that
// GCC vectorizes (a maximum of integers) at any ISA level: the scan is bound by reading memory.
template <typename Bits>
Bits max_bits(const Bits* p, int64_t n) {
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max() >> 1;  // all bits but the sign
  Bits top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max<Bits>(top, static_cast<Bits>(p[i] & kMagnitude));
  return top;
}

template <typename Bits>
float scan(const TensorView& t, float (*to_float)(Bits)) {
  const auto* data = static_cast<const Bits*>(t.data());
  const bool dense = t.is_dense();
  const int64_t rows = dense ? 1 : t.size(0), length = dense ? t.numel() : t.size(1);
  const int64_t row_stride = dense ? 0 : t.stride(0);
  // Chunks over the rows' elements: a chunk may hold parts of several rows.
  std::atomic<Bits> top{0};
  parallel_for(rows * length, kChunkElements, 1, [&](int64_t, int64_t begin, int64_t end) {
    Bits local = 0;
    for (int64_t i = begin; i < end;) {
      const int64_t row = i / length, column = i % length, count = std::min(end - i, length - column);
      local = std::max(local, max_bits(data + row * row_stride + column, count));
      i += count;
    }
    Bits seen = top.load(std::memory_order_relaxed);
    while (local > seen && !top.compare_exchange_weak(seen, local, std::memory_order_relaxed)) {
    }
  });
  return to_float(top.load(std::memory_order_relaxed));
}

// The sum of |to_float(p[i])| over n elements, in double from float partial sums over runs short enough that their
// rounding stays far below the bound's margin.
template <typename Element, typename ToFloat>
double sum_of_magnitudes(const Element* p, int64_t n, ToFloat to_float) {
  std::vector<double> partial(static_cast<size_t>(num_chunks(n, kChunkElements)), 0.0);
  parallel_for(n, kChunkElements, 1, [&](int64_t chunk, int64_t begin, int64_t end) {
    constexpr int64_t kRun = 4096;
    double sum = 0.0;
    for (int64_t i = begin; i < end; i += kRun) {
      const int64_t stop = std::min(end, i + kRun);
      float lanes[8] = {};  // eight independent sums, so the adds need not wait on one another
      for (int64_t j = i; j < stop; ++j) lanes[j % 8] += std::fabs(to_float(p[j]));
      for (float lane : lanes) sum += lane;
    }
    partial[static_cast<size_t>(chunk)] = sum;
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

float max_magnitude(const TensorView& t) {
  if (t.numel() == 0) return 0.0f;
  const bool rows = t.ndim() == 2 && (t.size(1) == 1 || t.stride(1) == 1) && t.stride(0) >= 0;
  if (!t.is_dense() && !rows) return std::numeric_limits<float>::quiet_NaN();
  switch (t.dtype()) {
    case DType::f32: return scan<uint32_t>(t, [](uint32_t b) { return bf16::bits_float(b); });
    case DType::bf16: return scan<uint16_t>(t, bf16::widen);
    case DType::f16: return scan<uint16_t>(t, half_to_float);
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

double magnitude_sum(const TensorView& t) {
  if (t.numel() == 0) return 0.0;
  if (!t.is_dense()) return std::nan("");
  switch (t.dtype()) {
    case DType::f32: return sum_of_magnitudes(t.data_as<const float>(), t.numel(), [](float v) { return v; });
    case DType::bf16: return sum_of_magnitudes(t.data_as<const uint16_t>(), t.numel(), bf16::widen);
    default: return std::nan("");
  }
}

}  // namespace ember
