// The rotate-half rotary embedding: every ISA path and every dtype combination against a double-precision reference
// of ember/rope.h, over odd feature counts, broadcast tables, a transposed x; results independent of the thread
// count, and argument checks that write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/rope.h"
#include "heads_tensor.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::Heads;
using testing::Matrix;

// A [L, D] table seen with `batched` as [B, 1, L, D] (batch stride L·D over a B·L·D buffer) or as [L, D].
struct Table {
  int64_t b, l, d;
  bool batched;
  Matrix storage;
  Table(int64_t b_, int64_t l_, int64_t d_, DType dtype, uint32_t seed, bool batched_)
      : b(b_), l(l_), d(d_), batched(batched_), storage(1, (batched_ ? b_ : 1) * l_ * d_, dtype, seed) {}
  double at(int64_t bi, int64_t li, int64_t di) const { return storage.at(0, ((batched ? bi : 0) * l + li) * d + di); }
  TensorView view() {
    void* data =
        storage.dtype == DType::bf16 ? static_cast<void*>(storage.bf16.data()) : static_cast<void*>(storage.f32.data());
    if (batched) {
      const int64_t sizes[4] = {b, 1, l, d}, strides[4] = {l * d, l * d, d, 1};
      return TensorView(data, storage.dtype, sizes, strides, 4);
    }
    return TensorView(data, storage.dtype, {l, d});
  }
};

// `rotary` features rotated (0: all d), the rest copied.
void run_case(int64_t b, int64_t h, int64_t l, int64_t d, DType x_dtype, DType table_dtype, DType out_dtype,
              bool batched, bool sequence_major, Isa isa, int64_t rotary = 0) {
  const int64_t r = rotary > 0 ? rotary : d;
  Heads x(b, h, l, d, x_dtype, 1, sequence_major), out(b, h, l, d, out_dtype, 2);
  Table cos(b, l, r, table_dtype, 3, batched), sin(b, l, r, table_dtype, 4, batched);
  rope::rotate_half(x.view(), cos.view(), sin.view(), out.view());
  const int64_t half = r / 2;
  const double tolerance = out_dtype == DType::bf16 ? 1.0 / 128 : 1e-5;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t li = 0; li < l; ++li) {
        for (int64_t i = 0; i < d; ++i) {
          const double rotated = i < half ? -x.at(bi, hi, li, i + half) : x.at(bi, hi, li, i - half);
          const double want =
              i < r ? x.at(bi, hi, li, i) * cos.at(bi, li, i) + rotated * sin.at(bi, li, i) : x.at(bi, hi, li, i);
          ASSERT_NEAR(out.at(bi, hi, li, i), want, tolerance * (1 + std::abs(want)))
              << "isa " << isa_name(isa) << " x " << dtype_name(x_dtype) << " tables " << dtype_name(table_dtype)
              << " out " << dtype_name(out_dtype) << " d " << d << " rotary " << r << " at (" << bi << ", " << hi
              << ", " << li << ", " << i << ")";
        }
      }
    }
  }
}

TEST(Rope, EveryDtypeCombinationMatchesTheDefinitionOnEveryPath) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    ASSERT_EQ(rope::implementation(), std::min(isa, Isa::avx512));
    for (DType x_dtype : {DType::f32, DType::bf16}) {
      for (DType table_dtype : {DType::f32, DType::bf16}) {
        for (DType out_dtype : {DType::f32, DType::bf16}) {
          for (int64_t d : {2, 6, 34, 64, 128}) {
            run_case(2, 3, 5, d, x_dtype, table_dtype, out_dtype, d % 4 == 0, d == 34, isa);
          }
          // Partial rotary embeddings: GPT-NeoX's quarter of 64 features, Phi's 32 of 80, a tail past a vector
          run_case(2, 3, 5, 64, x_dtype, table_dtype, out_dtype, true, true, isa, 16);
          run_case(1, 2, 3, 80, x_dtype, table_dtype, out_dtype, false, false, isa, 32);
          run_case(1, 2, 3, 70, x_dtype, table_dtype, out_dtype, false, true, isa, 2);
        }
      }
    }
  }
}

TEST(Rope, ResultsDoNotDependOnTheThreadCount) {
  const int saved = num_threads();
  Heads x(2, 8, 300, 64, DType::bf16, 1, true);
  Table cos(2, 300, 64, DType::f32, 3, true), sin(2, 300, 64, DType::f32, 4, true);
  std::vector<std::vector<uint16_t>> results;
  for (int threads : {1, 3, 8}) {
    set_num_threads(threads);
    Heads out(2, 8, 300, 64, DType::bf16, 2);
    rope::rotate_half(x.view(), cos.view(), sin.view(), out.view());
    results.push_back(out.storage.bf16);
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(Rope, BadArgumentsThrowAndWriteNothing) {
  Heads x(1, 2, 3, 8, DType::f32, 1), out(1, 2, 3, 8, DType::f32, 2), odd(1, 2, 3, 7, DType::f32, 1);
  Heads wrong(1, 2, 4, 8, DType::f32, 2);
  Table cos(1, 3, 8, DType::f32, 3, false), sin(1, 3, 8, DType::f32, 4, false),
      sin_bf16(1, 3, 8, DType::bf16, 4, false);
  Table long_cos(1, 4, 8, DType::f32, 3, false);
  Table wide(1, 3, 10, DType::f32, 3, false), odd_rotary(1, 3, 3, DType::f32, 3, false),
      half_sin(1, 3, 4, DType::f32, 4, false);
  const std::vector<float> before = out.storage.f32;
  const TensorView xv = x.view(), cv = cos.view(), sv = sin.view(), ov = out.view();
  const TensorView three_d(x.storage.f32.data(), DType::f32, {2, 3, 8});
  const TensorView int_table(cos.storage.f32.data(), DType::i32, {3, 8});
  const int64_t sizes[4] = {1, 2, 3, 8}, broadcast[4] = {0, 0, 8, 1};
  const TensorView out_broadcast(out.storage.f32.data(), DType::f32, sizes, broadcast, 4);

  EXPECT_THROW(rope::rotate_half(three_d, cv, sv, ov), ValueError);
  EXPECT_THROW(rope::rotate_half(odd.view(), cv, sv, ov), ValueError);
  EXPECT_THROW(rope::rotate_half(xv, cv, sin_bf16.view(), ov), TypeError);
  EXPECT_THROW(rope::rotate_half(xv, int_table, sv, ov), TypeError);
  EXPECT_THROW(rope::rotate_half(xv, long_cos.view(), sv, ov), ValueError);
  EXPECT_THROW(rope::rotate_half(xv, wide.view(), wide.view(), ov), ValueError);  // more features than x's
  EXPECT_THROW(rope::rotate_half(xv, odd_rotary.view(), odd_rotary.view(), ov), ValueError);
  EXPECT_THROW(rope::rotate_half(xv, cv, half_sin.view(), ov), ValueError);  // cos and sin of different widths
  EXPECT_THROW(rope::rotate_half(xv, cv, sv, wrong.view()), ValueError);
  EXPECT_THROW(rope::rotate_half(xv, cv, sv, out_broadcast), ValueError);
  EXPECT_THROW(rope::rotate_half(xv, cv, sv, xv), ValueError);  // in place over x
  EXPECT_EQ(out.storage.f32, before);
}

}  // namespace
}  // namespace ember
