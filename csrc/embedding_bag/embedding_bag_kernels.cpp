// The merged embedding bags' kernels for one ISA (embedding_bag_body.inl over the ISA's float vectors), and in the
// ref compilation the same body in double for float64 tables: compiled once per ISA by ember_kernel_family
// (CMakeLists.txt).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "embedding_bag_kernels.h"
#include "simd/kernel_isa.h"

namespace ember::embedding_bag::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/kernel_simd.inl"
#include "simd/simd_strips.inl"
#include "embedding_bag_body.inl"
// clang-format on
}  // namespace

template <typename W, typename Idx>
void EMBER_KERNEL(pool)(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  pool_range<VecF>(a, bag_begin, bag_end);
}
template <typename W, typename Idx>
void EMBER_KERNEL(per_sample_grad)(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  per_sample_grad_range<VecF>(a, bag_begin, bag_end);
}
template <typename W>
void EMBER_KERNEL(rows)(const RowArgs<W>& a, int64_t segment_begin, int64_t segment_end) {
  rows_range<VecF>(a, segment_begin, segment_end);
}
#define EMBER_INSTANTIATE(W, Idx)                                                     \
  template void EMBER_KERNEL(pool)<W, Idx>(const BagArgs<W, Idx>&, int64_t, int64_t); \
  template void EMBER_KERNEL(per_sample_grad)<W, Idx>(const BagArgs<W, Idx>&, int64_t, int64_t);
EMBER_INSTANTIATE(float, int64_t)
EMBER_INSTANTIATE(float, int32_t)
EMBER_INSTANTIATE(uint16_t, int64_t)
EMBER_INSTANTIATE(uint16_t, int32_t)
#undef EMBER_INSTANTIATE
template void EMBER_KERNEL(rows)<float>(const RowArgs<float>&, int64_t, int64_t);
template void EMBER_KERNEL(rows)<uint16_t>(const RowArgs<uint16_t>&, int64_t, int64_t);

#if EMBER_KERNEL_LEVEL == 0
// float64 tables, one double at a time: gradient checks and float64 references run through the same code.
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
#endif

}  // namespace ember::embedding_bag::kernels
