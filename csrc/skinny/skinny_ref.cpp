// Skinny matmul, reference path: portable C++, one fp32 accumulator per output, k summed in order. The oracle the
// vector paths are tested against (besides float64).
#include <cstdint>

#include "ember/bf16.h"
#include "skinny/skinny_kernels.h"
#include "skinny/skinny_matmul.h"

namespace ember::skinny::kernels {
namespace {

struct RefDot {
  using Vec = float;
  using Acc = float;
  static constexpr int kStep = 1;
  static constexpr int kRegisters = 0;
  static Acc zero() { return 0.0f; }
  static Vec load(const float* p) { return *p; }
  static Vec load(const uint16_t* p) { return bf16::widen(*p); }
  static Acc madd(Acc acc, Vec w, Vec x) { return acc + w * x; }
  static float sum(Acc acc) { return acc; }
};

// clang-format off
#include "skinny/skinny_body.inl"
// clang-format on
}  // namespace

template <typename S>
void dot_rows_ref(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                  float* y, int64_t ldy) {
  dot_rows_any<RefDot, S>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
}
template void dot_rows_ref<float>(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                  float*, int64_t);
template void dot_rows_ref<uint16_t>(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                                     int64_t, float*, int64_t);

}  // namespace ember::skinny::kernels
