// Dot interaction over float64 inputs: interaction_body.inl with V = ScalarD, one double at a time. It is there so
// that gradient checks and float64 references run through the same code as the fast paths; every machine runs it.
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
using V = ScalarD;
#include "interaction_body.inl"
// clang-format on
}  // namespace

void forward_f64(const Args<double>& a, int64_t begin, int64_t end) { forward_range(a, begin, end); }
void backward_f64(const Args<double>& a, int64_t begin, int64_t end) { backward_range(a, begin, end); }

}  // namespace ember::interaction::kernels
