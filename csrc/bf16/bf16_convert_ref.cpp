// Reference bf16 conversions: the scalar definitions of ember/bf16.h applied element by element, with plain
// stores whatever `stream` says.
#include "bf16_kernels.h"
#include "ember/bf16.h"

namespace ember::bf16::kernels {

void split_ref(const float* src, uint16_t* top, uint16_t* bottom, int64_t n, bool /*stream*/) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = float_bits(src[i]);
    top[i] = split_top(bits);
    bottom[i] = split_bottom(bits);
  }
}

void join_ref(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n, bool /*stream*/) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bits_float(join_bits(top[i], bottom[i]));
}

void round_ref(const float* src, uint16_t* dst, int64_t n, bool /*stream*/) {
  for (int64_t i = 0; i < n; ++i) dst[i] = round_bits(float_bits(src[i]));
}

}  // namespace ember::bf16::kernels
