// Dropout, reference path: one Philox block at a time, in plain 32- and 64-bit integer arithmetic.
#include <cstdint>

#include "dropout_kernels.h"
#include "ember/philox.h"  // the constants

namespace ember::dropout::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
// clang-format on

struct ScalarWords {
  using Words = uint32_t;
  static Words broadcast(uint32_t x) { return x; }
  static void counters(uint64_t first, Words& lo, Words& hi) {
    lo = static_cast<uint32_t>(first);
    hi = static_cast<uint32_t>(first >> 32);
  }
  static void mulhilo(Words a, Words m, Words& hi, Words& lo) {
    const uint64_t product = static_cast<uint64_t>(a) * m;
    hi = static_cast<uint32_t>(product >> 32);
    lo = static_cast<uint32_t>(product);
  }
  static Words xor3(Words a, Words b, Words c) { return a ^ b ^ c; }
  static float factor(Words word, Words threshold, float scale) { return word >= threshold ? scale : 0.0f; }
  static void lanes(Words word, uint32_t* out) { out[0] = word; }
};

// clang-format off
#include "dropout_body.inl"
// clang-format on
}  // namespace

template <typename S>
void apply_ref(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  dropout_range<ScalarF, ScalarWords, S>(x, y, begin, end, seed, threshold, scale);
}
template void apply_ref<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void apply_ref<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
