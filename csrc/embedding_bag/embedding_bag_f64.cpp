// Merged embedding bags over float64 tables: embedding_bag_body.inl instantiated for ScalarD, one double at a time.
// It is there so that gradient checks and float64 references run through the same code as the fast paths; every
// machine runs it.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "embedding_bag_kernels.h"

namespace ember::embedding_bag::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_strips.inl"
#include "embedding_bag_body.inl"
// clang-format on
}  // namespace

template <typename Idx>
void pool_f64(const BagArgs<double, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  pool_range<ScalarD>(a, bag_begin, bag_end);
}
template <typename Idx>
void per_sample_grad_f64(const BagArgs<double, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  per_sample_grad_range<ScalarD>(a, bag_begin, bag_end);
}
void rows_f64(const RowArgs<double>& a, int64_t segment_begin, int64_t segment_end) {
  rows_range<ScalarD>(a, segment_begin, segment_end);
}

template void pool_f64<int64_t>(const BagArgs<double, int64_t>&, int64_t, int64_t);
template void pool_f64<int32_t>(const BagArgs<double, int32_t>&, int64_t, int64_t);
template void per_sample_grad_f64<int64_t>(const BagArgs<double, int64_t>&, int64_t, int64_t);
template void per_sample_grad_f64<int32_t>(const BagArgs<double, int32_t>&, int64_t, int64_t);

}  // namespace ember::embedding_bag::kernels
