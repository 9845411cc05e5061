#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "ember/errors.h"
#include "ember/tensor_view.h"

namespace ember {
namespace {

TEST(TensorView, ContiguousConstructor) {
  float buf[24];
  TensorView v(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(v.ndim(), 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.nbytes(), 96U);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "float32[2, 3, 4]");
}

TEST(TensorView, Contiguity) {
  float buf[64];
  const int64_t sizes[] = {4, 4};
  const int64_t transposed[] = {1, 4};
  EXPECT_FALSE(TensorView(buf, DType::f32, sizes, transposed, 2).is_contiguous());
  const int64_t gapped[] = {8, 1};
  EXPECT_FALSE(TensorView(buf, DType::f32, sizes, gapped, 2).is_contiguous());
  // Size-1 dimensions may carry any stride (torch gives them arbitrary ones).
  const int64_t sizes1[] = {1, 4};
  const int64_t odd[] = {999, 1};
  EXPECT_TRUE(TensorView(buf, DType::f32, sizes1, odd, 2).is_contiguous());
  const int64_t empty_sizes[] = {0, 4};
  EXPECT_TRUE(TensorView(buf, DType::f32, empty_sizes, transposed, 2).is_contiguous());
  EXPECT_TRUE(TensorView(buf, DType::f32, {}).is_contiguous());  // a scalar
  EXPECT_EQ(TensorView(buf, DType::f32, {}).numel(), 1);
}

TEST(TensorView, RejectsBadShapes) {
  float buf[4];
  const int64_t negative[] = {-1};
  const int64_t one[] = {1};
  EXPECT_THROW(TensorView(buf, DType::f32, negative, one, 1), ValueError);
  const int64_t many[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(TensorView(buf, DType::f32, many, many, 9), ValueError);
}

TEST(TensorView, Overlap) {
  std::vector<uint16_t> buf(100);
  TensorView a(buf.data(), DType::i16, {10});
  TensorView b(buf.data() + 10, DType::i16, {10});
  TensorView c(buf.data() + 9, DType::i16, {10});
  EXPECT_FALSE(a.overlaps(b));
  EXPECT_TRUE(a.overlaps(c));
  EXPECT_TRUE(a.overlaps(a));
  // A float32 view of the same bytes overlaps at the byte level.
  TensorView f(buf.data() + 18, DType::f32, {1});
  EXPECT_TRUE(f.overlaps(c));
  EXPECT_FALSE(f.overlaps(a));
  // Empty views overlap nothing.
  TensorView empty(buf.data(), DType::i16, {0});
  EXPECT_FALSE(empty.overlaps(a));
  // Negative strides span downward from the data pointer.
  const int64_t size[] = {5};
  const int64_t backwards[] = {-1};
  TensorView rev(buf.data() + 24, DType::i16, size, backwards, 1);  // elements 20..24
  EXPECT_TRUE(rev.overlaps(TensorView(buf.data() + 20, DType::i16, {1})));
  EXPECT_FALSE(rev.overlaps(TensorView(buf.data() + 25, DType::i16, {1})));
}

TEST(TensorView, ByteExtentAndWithData) {
  std::vector<float> buf(64);
  const int64_t sizes[] = {3, 4}, transposed[] = {1, 3};
  const TensorView t(buf.data(), DType::f32, sizes, transposed, 2);  // a transposed [4, 3]: elements 0..11
  EXPECT_EQ(t.byte_extent(), 12 * 4);
  EXPECT_EQ(TensorView(buf.data(), DType::bf16, {2, 5}).byte_extent(), 10 * 2);
  EXPECT_EQ(TensorView(buf.data(), DType::f32, {0, 5}).byte_extent(), 0);
  const int64_t one[] = {1}, back[] = {-1}, two[] = {2};
  EXPECT_EQ(TensorView(buf.data() + 8, DType::f32, one, back, 1).byte_extent(), 4);  // one element: no reach
  EXPECT_EQ(TensorView(buf.data() + 8, DType::f32, two, back, 1).byte_extent(), -1);
  const TensorView moved = t.with_data(buf.data() + 20);
  EXPECT_EQ(moved.data(), buf.data() + 20);
  EXPECT_EQ(moved.dtype(), DType::f32);
  EXPECT_EQ(moved.stride(1), 3);
  EXPECT_EQ(moved.numel(), 12);
}

TEST(TensorView, ChecksNameTheArgument) {
  float f[4];
  uint16_t h[4];
  TensorView src(f, DType::f32, {4});
  TensorView top(h, DType::bf16, {2, 2});
  try {
    check::dtype("op", "top", top, DType::f32);
    FAIL() << "expected TypeError";
  } catch (const TypeError& e) {
    EXPECT_EQ(std::string(e.what()), "op: top must have dtype float32, got bfloat16");
  }
  try {
    check::same_shape("op", "top", top, "src", src);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "op: top must have the shape of src (float32[4]), got bfloat16[2, 2]");
  }
  EXPECT_THROW(check::no_overlap("op", "src", src, "src", src), ValueError);
  EXPECT_NO_THROW(check::no_overlap("op", "src", src, "top", top));
}

TEST(DType, Sizes) {
  EXPECT_EQ(dtype_size(DType::f32), 4U);
  EXPECT_EQ(dtype_size(DType::bf16), 2U);
  EXPECT_EQ(dtype_size(DType::f16), 2U);
  EXPECT_EQ(dtype_size(DType::i8), 1U);
  EXPECT_EQ(dtype_size(DType::u8), 1U);
  EXPECT_EQ(dtype_size(DType::i16), 2U);
  EXPECT_EQ(dtype_size(DType::i32), 4U);
  EXPECT_EQ(dtype_size(DType::i64), 8U);
  EXPECT_EQ(dtype_size(DType::f64), 8U);
  EXPECT_EQ(dtype_size(DType::boolean), 1U);
  EXPECT_EQ(dtype_name(DType::f64), "float64");
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

TEST(TensorView, DenseInAnyDimensionOrder) {
  float buf[2 * 3 * 4 * 5];
  const int64_t sizes[] = {2, 3, 4, 5};
  const int64_t row_major[] = {60, 20, 5, 1};
  const int64_t channels_last[] = {60, 1, 15, 3};
  const int64_t gapped[] = {120, 40, 10, 2};
  EXPECT_TRUE(TensorView(buf, DType::f32, sizes, row_major, 4).is_dense());
  EXPECT_TRUE(TensorView(buf, DType::f32, sizes, channels_last, 4).is_dense());
  EXPECT_FALSE(TensorView(buf, DType::f32, sizes, channels_last, 4).is_contiguous());
  EXPECT_FALSE(TensorView(buf, DType::f32, sizes, gapped, 4).is_dense());
  const int64_t overlapping[] = {1, 1, 1, 1};
  EXPECT_FALSE(TensorView(buf, DType::f32, sizes, overlapping, 4).is_dense());
  const int64_t sizes1[] = {1, 6};
  const int64_t odd[] = {7, 1};
  EXPECT_TRUE(TensorView(buf, DType::f32, sizes1, odd, 2).is_dense());
  const TensorView a(buf, DType::f32, sizes, row_major, 4), b(buf, DType::f32, sizes, channels_last, 4);
  EXPECT_TRUE(a.same_layout(a));
  EXPECT_FALSE(a.same_layout(b));
}

// [..., K] views as [rows, K]: row-major leading dimensions at any row stride flatten; size-1 dimensions are
// ignored whatever their stride; leading dimensions out of order, or with gaps between them, do not flatten.
TEST(TensorView, AsMatrixFlattensLeadingDimensionsThatStepAsOne) {
  float buffer[1];
  auto view = [&](std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    return TensorView(buffer, DType::f32, sizes.data(), strides.data(), static_cast<int>(sizes.size()));
  };
  auto expect_matrix = [](const std::optional<TensorView>& m, int64_t rows, int64_t cols, int64_t row_stride) {
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->ndim(), 2);
    EXPECT_EQ(m->size(0), rows);
    EXPECT_EQ(m->size(1), cols);
    EXPECT_EQ(m->stride(0), row_stride);
    EXPECT_EQ(m->stride(1), 1);
  };
  expect_matrix(view({2, 3, 4}, {12, 4, 1}).as_matrix(), 6, 4, 4);
  expect_matrix(view({2, 3, 4}, {18, 6, 1}).as_matrix(), 6, 4, 6);  // padded rows
  expect_matrix(view({1, 3, 4}, {1, 4, 1}).as_matrix(), 3, 4, 4);   // torch 1.13 exports size-1 strides as 1
  expect_matrix(view({2, 1, 4}, {4, 1, 1}).as_matrix(), 2, 4, 4);
  expect_matrix(view({1, 1, 4}, {1, 1, 1}).as_matrix(), 1, 4, 4);
  expect_matrix(view({0, 3, 4}, {12, 4, 1}).as_matrix(), 0, 4, 4);
  expect_matrix(view({5, 4}, {7, 1}).as_matrix(), 5, 4, 7);
  expect_matrix(view({2, 2, 3, 4}, {24, 12, 4, 1}).as_matrix(), 12, 4, 4);
  EXPECT_FALSE(view({2, 3, 4}, {100, 4, 1}).as_matrix().has_value());  // a gap between batches
  EXPECT_FALSE(view({3, 2, 4}, {4, 12, 1}).as_matrix().has_value());   // leading dimensions transposed
  EXPECT_FALSE(view({4}, {1}).as_matrix().has_value());
  // Expanded (zero-stride) rows keep their zero stride: the kernels' checks then see the overlap (the stride was
  // once taken for "unset" and replaced by the row length, reading past the one row there is).
  expect_matrix(view({5, 4}, {0, 1}).as_matrix(), 5, 4, 0);
  expect_matrix(view({2, 3, 4}, {0, 0, 1}).as_matrix(), 6, 4, 0);
  EXPECT_FALSE(view({2, 3, 4}, {0, 4, 1}).as_matrix().has_value());
}

}  // namespace
}  // namespace ember
