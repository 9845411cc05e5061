// Merged embedding bags, avx2 path (8 floats per ymm register): embedding_bag_body.inl instantiated for Avx2F.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "embedding_bag_kernels.h"

namespace ember::embedding_bag::kernels {
namespace {
// The vector types must come before the body that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx2.inl"
#include "simd/simd_strips.inl"
#include "embedding_bag_body.inl"
// clang-format on
}  // namespace

template <typename W, typename Idx>
void pool_avx2(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  pool_range<Avx2F>(a, bag_begin, bag_end);
}
template <typename W, typename Idx>
void per_sample_grad_avx2(const BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  per_sample_grad_range<Avx2F>(a, bag_begin, bag_end);
}
template <typename W>
void rows_avx2(const RowArgs<W>& a, int64_t segment_begin, int64_t segment_end) {
  rows_range<Avx2F>(a, segment_begin, segment_end);
}
EMBER_EMBEDDING_BAG_INSTANTIATE(avx2)

}  // namespace ember::embedding_bag::kernels
