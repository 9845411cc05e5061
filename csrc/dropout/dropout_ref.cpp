// Dropout, reference path: one Philox block at a time through the scalar definition of ember/philox.h.
#include <cstdint>

#include "dropout_kernels.h"
#include "ember/philox.h"

namespace ember::dropout::kernels {
namespace {
// clang-format off
#include "simd/simd_scalar.inl"
// clang-format on

struct ScalarPhilox {
  using Words = uint32_t;
  static Words broadcast(uint32_t x) { return x; }
  using Keys = uint64_t;
  static Keys keys(uint32_t k0, uint32_t k1) { return static_cast<uint64_t>(k1) << 32 | k0; }
  static void blocks(uint64_t first, Keys key, Words out[4]) {
    const auto words = philox::block_words(key, first);
    for (int w = 0; w < 4; ++w) out[w] = words[w];
  }
  static float factor(Words word, Words threshold, float scale) { return word >= threshold ? scale : 0.0f; }
  static void lanes(Words word, uint32_t* out) { out[0] = word; }
};

// clang-format off
#include "dropout_body.inl"
// clang-format on
}  // namespace

template <typename S>
void apply_ref(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  dropout_range<ScalarF, ScalarPhilox, S>(x, y, begin, end, seed, threshold, scale);
}
template void apply_ref<float>(const float*, float*, int64_t, int64_t, uint64_t, uint32_t, float);
template void apply_ref<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, uint64_t, uint32_t, float);

}  // namespace ember::dropout::kernels
