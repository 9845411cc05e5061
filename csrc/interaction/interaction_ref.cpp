// Dot interaction, reference path (one element at a time): interaction_body.inl with V = ScalarF.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "interaction_kernels.h"

namespace ember::interaction::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_strips.inl"
using V = ScalarF;
#include "interaction_body.inl"
// clang-format on
}  // namespace

template <typename W>
void forward_ref(const Args<W>& a, int64_t begin, int64_t end) {
  forward_range(a, begin, end);
}
template <typename W>
void backward_ref(const Args<W>& a, int64_t begin, int64_t end) {
  backward_range(a, begin, end);
}
EMBER_INTERACTION_INSTANTIATE(ref)

}  // namespace ember::interaction::kernels
