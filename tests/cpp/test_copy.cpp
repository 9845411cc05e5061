#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ember/copy.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/tensor_view.h"

namespace ember {
namespace {

/// Row-major strides of `sizes`, laid out in the order `order` (outermost first).
std::vector<int64_t> strides_in(const std::vector<int64_t>& sizes, const std::vector<int>& order) {
  std::vector<int64_t> strides(sizes.size());
  int64_t step = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    strides[static_cast<size_t>(*d)] = step;
    step *= sizes[static_cast<size_t>(*d)];
  }
  return strides;
}

/// The element offset of flat (row-major) index `flat` in a view of these sizes and strides.
int64_t offset_of(int64_t flat, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t offset = 0;
  for (size_t d = sizes.size(); d-- > 0;) {
    offset += (flat % sizes[d]) * strides[d];
    flat /= sizes[d];
  }
  return offset;
}

template <typename T>
void check_random_layouts(DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int dims = 1 + static_cast<int>(rng() % 5);
    std::vector<int64_t> sizes(static_cast<size_t>(dims));
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 7);
    // src: a permuted layout inside a larger buffer, some dimensions gapped and, now and then, one broadcast
    std::vector<int> order(static_cast<size_t>(dims));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> src_strides = strides_in(sizes, order);
    for (auto& st : src_strides) st *= 1 + static_cast<int64_t>(rng() % 2);
    if (rng() % 4 == 0) src_strides[rng() % static_cast<size_t>(dims)] = 0;
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<int64_t> dst_strides = strides_in(sizes, order);
    int64_t numel = 1, reach = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      numel *= sizes[d];
      reach += (sizes[d] - 1) * src_strides[d];
    }
    std::vector<T> src(static_cast<size_t>(reach));
    for (auto& v : src) v = static_cast<T>(rng());
    std::vector<T> dst(static_cast<size_t>(numel) + 1, T{0});
    const T sentinel = static_cast<T>(0x5a);
    dst.back() = sentinel;
    copy(TensorView(src.data(), dtype, sizes.data(), src_strides.data(), dims),
         TensorView(dst.data(), dtype, sizes.data(), dst_strides.data(), dims));
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_EQ(dst[static_cast<size_t>(offset_of(i, sizes, dst_strides))],
                src[static_cast<size_t>(offset_of(i, sizes, src_strides))])
          << "trial " << trial << " element " << i;
    }
    ASSERT_EQ(dst.back(), sentinel);  // nothing written past dst
  }
}

TEST(Copy, EveryElementWidthAndLayout) {
  check_random_layouts<uint8_t>(DType::u8, 1);
  check_random_layouts<uint16_t>(DType::bf16, 2);
  check_random_layouts<uint32_t>(DType::f32, 3);
  check_random_layouts<uint64_t>(DType::i64, 4);
}

TEST(Copy, LargeTransposeSplitOverThreadsIsTheSameForAnyThreadCount) {
  const int64_t rows = 300, cols = 257;  // past the parallel threshold; a row split between chunks
  std::vector<float> src(static_cast<size_t>(rows * cols));
  std::iota(src.begin(), src.end(), 0.0F);
  const int64_t sizes[] = {cols, rows};
  const int64_t transposed[] = {1, cols};
  const int threads = num_threads();
  for (int n : {1, 3, 8}) {
    set_num_threads(n);
    std::vector<float> dst(static_cast<size_t>(rows * cols), -1.0F);
    copy(TensorView(src.data(), DType::f32, sizes, transposed, 2), TensorView(dst.data(), DType::f32, {cols, rows}));
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(dst[static_cast<size_t>(c * rows + r)], src[static_cast<size_t>(r * cols + c)]);
      }
    }
    // contiguous to contiguous: one row, split between the chunks
    std::vector<float> flat(src.size(), -1.0F);
    copy(TensorView(src.data(), DType::f32, {rows * cols}), TensorView(flat.data(), DType::f32, {rows * cols}));
    ASSERT_EQ(flat, src);
  }
  set_num_threads(threads);
}

// An image made channels-last: runs of a few channels along dst, each read H x W apart, which the copy walks by tiles
// of the pixels (copy_tiles); pixel counts past a tile and not a multiple of one, every element width, any thread
// count, and channel counts on both sides of the short-run bound.
TEST(Copy, AFewChannelsMadeChannelsLastByTiles) {
  const int threads = num_threads();
  for (const int64_t channels : {1, 2, 3, 4, 16, 17}) {
    for (const int64_t batch : {1, 3}) {
      const int64_t height = 37, width = 61;  // 2257 pixels: two whole tiles and part of a third
      const int64_t sizes[] = {batch, channels, height, width};
      const int64_t nchw[] = {channels * height * width, height * width, width, 1};
      const int64_t nhwc[] = {channels * height * width, 1, width * channels, channels};
      const int64_t numel = batch * channels * height * width;
      std::vector<uint16_t> src(static_cast<size_t>(numel));
      std::iota(src.begin(), src.end(), uint16_t{1});
      for (int n : {1, 2, 5}) {
        set_num_threads(n);
        std::vector<uint16_t> dst(static_cast<size_t>(numel) + 1, 0);
        dst.back() = 0x5a;
        copy(TensorView(src.data(), DType::bf16, sizes, nchw, 4), TensorView(dst.data(), DType::bf16, sizes, nhwc, 4));
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t c = 0; c < channels; ++c) {
            for (int64_t p = 0; p < height * width; ++p) {
              ASSERT_EQ(dst[static_cast<size_t>(b * nhwc[0] + p * channels + c)],
                        src[static_cast<size_t>(b * nchw[0] + c * height * width + p)])
                  << channels << " channels, batch " << batch << ", " << n << " threads";
            }
          }
        }
        ASSERT_EQ(dst.back(), 0x5a);
      }
      std::vector<double> wide(static_cast<size_t>(numel)), wide_dst(static_cast<size_t>(numel));
      std::iota(wide.begin(), wide.end(), 0.5);
      copy(TensorView(wide.data(), DType::f64, sizes, nchw, 4),
           TensorView(wide_dst.data(), DType::f64, sizes, nhwc, 4));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t c = 0; c < channels; ++c) {
          for (int64_t p = 0; p < height * width; ++p) {
            ASSERT_EQ(wide_dst[static_cast<size_t>(b * nhwc[0] + p * channels + c)],
                      wide[static_cast<size_t>(b * nchw[0] + c * height * width + p)]);
          }
        }
      }
    }
  }
  set_num_threads(threads);
}

TEST(Copy, RefusesBadArgumentsWithNothingWritten) {
  std::vector<float> src(16, 1.0F), dst(16, 0.0F);
  std::vector<uint16_t> half(16, 0);
  const TensorView s(src.data(), DType::f32, {4, 4});
  EXPECT_THROW(copy(s, TensorView(half.data(), DType::bf16, {4, 4})), TypeError);  // another dtype
  EXPECT_THROW(copy(s, TensorView(dst.data(), DType::f32, {2, 8})), ValueError);   // other sizes
  const int64_t sizes[] = {4, 4}, repeated[] = {0, 1}, negative[] = {-4, 1};
  EXPECT_THROW(copy(s, TensorView(dst.data(), DType::f32, sizes, repeated, 2)), ValueError);  // dst not dense
  EXPECT_THROW(
      copy(TensorView(src.data() + 12, DType::f32, sizes, negative, 2), TensorView(dst.data(), DType::f32, {4, 4})),
      ValueError);
  EXPECT_THROW(copy(s, TensorView(src.data(), DType::f32, {4, 4})), ValueError);  // dst is src
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](float v) { return v == 0.0F; }));
  EXPECT_TRUE(std::all_of(half.begin(), half.end(), [](uint16_t v) { return v == 0; }));
  copy(TensorView(src.data(), DType::f32, {0, 4}), TensorView(dst.data(), DType::f32, {0, 4}));  // nothing to move
  EXPECT_EQ(dst[0], 0.0F);
}

TEST(Copy, WritesIntoAPartOfALargerTensorAsACatDoes) {
  // cat([a, b], dim=1) of a [2, 3] and a [2, 2]: each copied into its columns of the [2, 5] result
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10};
  std::vector<float> out(10, 0.0F);
  const int64_t a_sizes[] = {2, 3}, b_sizes[] = {2, 2}, strides[] = {5, 1};
  copy(TensorView(const_cast<float*>(a.data()), DType::f32, {2, 3}),
       TensorView(out.data(), DType::f32, a_sizes, strides, 2));
  copy(TensorView(const_cast<float*>(b.data()), DType::f32, {2, 2}),
       TensorView(out.data() + 3, DType::f32, b_sizes, strides, 2));
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 7, 8, 4, 5, 6, 9, 10}));
  // a dst whose rows overlap (stride 2 over rows of 3) is refused
  const int64_t overlapping[] = {2, 1};
  EXPECT_THROW(copy(TensorView(const_cast<float*>(a.data()), DType::f32, {2, 3}),
                    TensorView(out.data(), DType::f32, a_sizes, overlapping, 2)),
               ValueError);
}

TEST(Zero, ZeroesAViewAndNothingBesideIt) {
  // the border of a [4, 5] pad of a [2, 3] input: zero every element of a strided column view, then the whole
  std::vector<uint16_t> out(20, 7);
  const int64_t sizes[] = {4}, column[] = {5};
  zero(TensorView(out.data() + 1, DType::bf16, sizes, column, 1));
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i % 5 == 1 ? 0 : 7) << i;
  zero(TensorView(out.data(), DType::bf16, {4, 5}));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0; }));
  std::vector<double> wide(3 * 1000, 1.0);  // past the parallel threshold in bytes, split between chunks
  zero(TensorView(wide.data(), DType::f64, {3, 1000}));
  EXPECT_TRUE(std::all_of(wide.begin(), wide.end(), [](double v) { return v == 0.0; }));
  const int64_t two[] = {2, 3}, overlapping[] = {1, 1};
  std::vector<float> kept(8, 5.0F);
  EXPECT_THROW(zero(TensorView(kept.data(), DType::f32, two, overlapping, 2)), ValueError);
  EXPECT_TRUE(std::all_of(kept.begin(), kept.end(), [](float v) { return v == 5.0F; }));
}

TEST(GatherRows, GathersAndRefusesWithNothingWritten) {
  std::vector<uint16_t> src(5 * 3);
  std::iota(src.begin(), src.end(), uint16_t{0});
  std::vector<int64_t> rows = {4, 0, 4, 2};
  std::vector<uint16_t> out(4 * 3, 0);
  const TensorView s(src.data(), DType::bf16, {5, 3});
  const TensorView r(rows.data(), DType::i64, {4});
  gather_rows(s, r, TensorView(out.data(), DType::bf16, {4, 3}));
  EXPECT_EQ(out, (std::vector<uint16_t>{12, 13, 14, 0, 1, 2, 12, 13, 14, 6, 7, 8}));
  // rows apart in src (a slice of wider rows) are read where they lie
  const int64_t sizes[] = {5, 2}, apart[] = {3, 1};
  std::vector<uint16_t> narrow(4 * 2, 0);
  gather_rows(TensorView(src.data(), DType::bf16, sizes, apart, 2), r, TensorView(narrow.data(), DType::bf16, {4, 2}));
  EXPECT_EQ(narrow, (std::vector<uint16_t>{12, 13, 0, 1, 12, 13, 6, 7}));

  std::vector<uint16_t> untouched(4 * 3, 7);
  const TensorView u(untouched.data(), DType::bf16, {4, 3});
  std::vector<int64_t> bad = {0, 5, 1, 1};
  EXPECT_THROW(gather_rows(s, TensorView(bad.data(), DType::i64, {4}), u), IndexError);
  bad[1] = -1;
  EXPECT_THROW(gather_rows(s, TensorView(bad.data(), DType::i64, {4}), u), IndexError);
  std::vector<int32_t> narrow_index = {0, 1, 2, 3};
  EXPECT_THROW(gather_rows(s, TensorView(narrow_index.data(), DType::i32, {4}), u), TypeError);
  EXPECT_THROW(gather_rows(s, r, TensorView(untouched.data(), DType::bf16, {3, 4})), ValueError);
  EXPECT_THROW(gather_rows(s, r, TensorView(src.data(), DType::bf16, {4, 3})), ValueError);  // out is src
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == 7; }));
}

}  // namespace
}  // namespace ember
