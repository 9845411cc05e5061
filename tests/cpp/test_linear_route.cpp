// The Linear router (csrc/linear/linear_route.h) rule by rule: when the caller's own matmul is named the faster one,
// which ember kernel serves the rest, that Linear::forward runs the kernel route() names (its implementation()
// agrees), and the refusals. Weights here are shapes only: route() reads no data.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "ember/errors.h"
#include "ember/linear.h"
#include "onednn/onednn_common.h"
#include "random_matrix.h"
#include "tile_matmul/tile_matmul.h"

namespace ember {
namespace {

// A shape-only [n, k] weight, row-major or (k_major) a transposed view of a [k, n] one, as Hugging Face's Conv1D.
struct Weight {
  std::array<int64_t, 2> sizes, strides;
  DType dtype;
  Weight(int64_t n, int64_t k, DType dtype, bool k_major = false)
      : sizes{n, k}, strides{k_major ? std::array<int64_t, 2>{1, n} : std::array<int64_t, 2>{k, 1}}, dtype(dtype) {}
  TensorView view() const { return {nullptr, dtype, sizes.data(), strides.data(), 2}; }
};

LinearKernel route(DType compute, int64_t rows, const Weight& w, bool in_place, bool mkl) {
  return Linear::route(compute, rows, w.view(), in_place, mkl);
}

constexpr bool kInPlace = true, kPacked = false, kMkl = true, kOther = false;

TEST(LinearRoute, WithoutMklEveryFp32CallStaysOnEmbersKernels) {
  for (const auto& w : {Weight(64, 48, DType::f32), Weight(768, 768, DType::f32), Weight(1100, 1024, DType::f32),
                        Weight(64, 48, DType::f32, /*k_major=*/true)}) {
    for (int64_t rows : {1, 2, 3, 5, 8, 9, 64, 300}) {
      for (bool in_place : {kInPlace, kPacked}) {
        EXPECT_NE(route(DType::f32, rows, w, in_place, kOther), LinearKernel::caller)
            << w.sizes[0] << "x" << w.sizes[1] << " rows " << rows << " in place " << in_place;
      }
    }
  }
}

TEST(LinearRoute, MklFp32WinsTinyWeightsInPlaceAtEveryFewRowCount) {
  const Weight tiny(64, 48, DType::f32);  // under 1M elements
  for (int64_t rows = 1; rows <= Linear::skinny_rows(DType::f32); ++rows) {
    EXPECT_EQ(route(DType::f32, rows, tiny, kInPlace, kMkl), LinearKernel::caller) << rows;
    EXPECT_EQ(route(DType::f32, rows, tiny, kInPlace, kOther), LinearKernel::skinny) << rows;
  }
}

TEST(LinearRoute, MklFp32WinsSmallWeightsInPlaceOnlyAtTheMeasuredRowCounts) {
  const Weight small(1100, 1024, DType::f32);  // between 1M and 4M elements
  for (int64_t rows : {2, 5, 6, 7, 8}) EXPECT_EQ(route(DType::f32, rows, small, kInPlace, kMkl), LinearKernel::caller);
  for (int64_t rows : {1, 3, 4}) EXPECT_EQ(route(DType::f32, rows, small, kInPlace, kMkl), LinearKernel::skinny);
  const Weight large(4096, 1024, DType::f32);  // 4M: the skinny matmul at every few-row count
  for (int64_t rows = 1; rows <= 8; ++rows)
    EXPECT_EQ(route(DType::f32, rows, large, kInPlace, kMkl), LinearKernel::skinny);
}

TEST(LinearRoute, MklFp32WinsPackedLayersAtOneRowAndSmallWeightsAtFewRows) {
  const Weight small(1100, 1024, DType::f32), large(4096, 1024, DType::f32);
  EXPECT_EQ(route(DType::f32, 1, large, kPacked, kMkl), LinearKernel::caller);
  EXPECT_EQ(route(DType::f32, 2, large, kPacked, kMkl), LinearKernel::onednn);
  EXPECT_EQ(route(DType::f32, 8, small, kPacked, kMkl), LinearKernel::caller);
  EXPECT_EQ(route(DType::f32, 9, small, kPacked, kMkl), LinearKernel::onednn);
  // bf16 is never the caller's on a packed copy: a few rows go to the few-row matmul where AVX512-BF16 runs.
  EXPECT_EQ(route(DType::bf16, 1, Weight(64, 48, DType::bf16), kPacked, kMkl),
            tile_matmul::few_rows_available(DType::bf16) ? LinearKernel::few_rows : LinearKernel::onednn);
}

TEST(LinearRoute, KMajorWeightsInPlaceGoToTheCallerAtFewRows) {
  const Weight bf16(768, 768, DType::bf16, /*k_major=*/true), f32(768, 768, DType::f32, /*k_major=*/true);
  for (int64_t rows : {1, 8}) {
    EXPECT_EQ(route(DType::bf16, rows, bf16, kInPlace, kOther), LinearKernel::caller) << rows;
    EXPECT_EQ(route(DType::f32, rows, f32, kInPlace, kMkl), LinearKernel::caller) << rows;
    EXPECT_EQ(route(DType::f32, rows, f32, kInPlace, kOther), LinearKernel::onednn) << rows;  // never skinny
  }
  EXPECT_EQ(route(DType::bf16, 9, bf16, kInPlace, kOther), LinearKernel::onednn);
}

TEST(LinearRoute, HugeBf16WeightsInPlaceGoToTheCallerBeyondTheSkinnyRows) {
  const Weight huge(11008, 4096, DType::bf16), big(4096, 4096, DType::bf16);  // 45M and 16M elements
  const int64_t skinny = Linear::skinny_rows(DType::bf16);
  EXPECT_EQ(route(DType::bf16, skinny, huge, kInPlace, kOther), LinearKernel::skinny);
  EXPECT_EQ(route(DType::bf16, skinny + 1, huge, kInPlace, kOther), LinearKernel::caller);
  // A packed copy beyond the skinny rows: oneDNN below the tile matmul's rows, the tile matmul in them where AMX
  // runs (tests/cpp/test_tile_matmul.cpp).
  ASSERT_LT(skinny + 1, tile_matmul::kMinRows);
  EXPECT_EQ(route(DType::bf16, skinny + 1, huge, kPacked, kOther), LinearKernel::onednn);
  EXPECT_EQ(route(DType::bf16, tile_matmul::kMinRows, huge, kPacked, kOther),
            tile_matmul::available(DType::bf16) ? LinearKernel::tiles : LinearKernel::onednn);
  EXPECT_EQ(route(DType::bf16, skinny + 1, big, kInPlace, kOther), LinearKernel::onednn);
}

TEST(LinearRoute, Fp32InPlaceWiderThanTallRunsTransposedFromNineToTwoHundredFiftySixRows) {
  const Weight wide(768, 3072, DType::f32), tall(3072, 768, DType::f32), beyond_caches(4096, 4096, DType::f32);
  EXPECT_EQ(route(DType::f32, 8, wide, kInPlace, kOther), LinearKernel::skinny);
  for (int64_t rows : {9, 16, 256}) {
    EXPECT_EQ(route(DType::f32, rows, wide, kInPlace, kOther), LinearKernel::swapped) << rows;
    EXPECT_EQ(route(DType::f32, rows, beyond_caches, kInPlace, kOther), LinearKernel::swapped) << rows;
    EXPECT_EQ(route(DType::f32, rows, tall, kInPlace, kOther), LinearKernel::onednn) << rows;
    EXPECT_EQ(route(DType::f32, rows, wide, kPacked, kOther), LinearKernel::onednn) << rows;
  }
  EXPECT_EQ(route(DType::f32, 257, wide, kInPlace, kOther), LinearKernel::onednn);
  EXPECT_EQ(route(DType::bf16, 16, Weight(768, 3072, DType::bf16), kInPlace, kOther),
            Linear::skinny_rows(DType::bf16) >= 16 ? LinearKernel::skinny : LinearKernel::onednn);
}

// What route() names is what forward runs: implementation() reports the same kernel for the same call.
TEST(LinearRoute, ForwardRunsTheKernelRouteNames) {
  testing::Matrix w(48, 300, DType::f32, 1);
  const TensorView wv = w.view();
  const Linear in_place(wv, nullptr, {DType::f32, false});
  const Linear packed(wv, nullptr, {DType::f32, true});
  for (int64_t rows : {1, 8, 9, 256, 257}) {
    const LinearKernel kernel = Linear::route(DType::f32, rows, wv, kInPlace, kOther);
    const std::string name = in_place.implementation(rows, &wv);
    EXPECT_EQ(name.rfind("ember:skinny:", 0) == 0, kernel == LinearKernel::skinny) << rows << " " << name;
    EXPECT_EQ(name.find("(swapped)") != std::string::npos, kernel == LinearKernel::swapped) << rows << " " << name;
    EXPECT_EQ(Linear::route(DType::f32, rows, wv, kPacked, kOther), LinearKernel::onednn);
    EXPECT_EQ(packed.implementation(rows).find("ember:"), std::string::npos);
  }
}

// oneDNN 3.2 reads a bf16 or f16 binary post-op operand in its own kernels only from AVX-512 up; below, the whole
// primitive fell to its reference matmul (a 128x768x768 fp32 Linear adding a bf16 residual: 1.4 s on a Zen 3, 1.8 ms
// with ember's epilogue adding it). An fp32 residual it reads everywhere.
TEST(LinearRoute, OnednnAddsAResidualOnlyWhereItsKernelsReadItsDtype) {
  const Weight f32(4, 4, DType::f32), bf16(4, 4, DType::bf16), f16(4, 4, DType::f16);
  const bool avx512 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    return (isa & static_cast<unsigned>(dnnl::cpu_isa::avx512_core)) ==
           static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  }();
  EXPECT_TRUE(onednn::primitive_reads(f32.view()));
  EXPECT_EQ(onednn::primitive_reads(bf16.view()), avx512);
  EXPECT_EQ(onednn::primitive_reads(f16.view()), avx512);
  const Epilogue add{PostOp::add()}, relu_then_add{PostOp::act(Activation::relu), PostOp::add()};
  const TensorView low = bf16.view(), full = f32.view();
  EXPECT_TRUE(onednn::primitive_adds(add, &full));
  EXPECT_EQ(onednn::primitive_adds(add, &low), avx512);
  EXPECT_FALSE(onednn::primitive_adds(relu_then_add, &full));  // an activation first: never the primitive's
}

TEST(LinearRoute, NamesEveryKernel) {
  EXPECT_STREQ(kernel_name(LinearKernel::caller), "caller");
  EXPECT_STREQ(kernel_name(LinearKernel::skinny), "skinny");
  EXPECT_STREQ(kernel_name(LinearKernel::tiles), "tiles");
  EXPECT_STREQ(kernel_name(LinearKernel::swapped), "swapped");
  EXPECT_STREQ(kernel_name(LinearKernel::onednn), "onednn");
}

TEST(LinearRoute, RefusesBadQuestions) {
  const Weight w(64, 48, DType::f32);
  EXPECT_THROW(route(DType::f32, 0, w, kInPlace, kOther), ValueError);
  EXPECT_THROW(route(DType::f32, -3, w, kInPlace, kOther), ValueError);
  EXPECT_THROW(route(DType::f16, 1, w, kInPlace, kOther), TypeError);
  EXPECT_THROW(route(DType::bf16, 1, w, kInPlace, kOther), TypeError);  // in place must be the compute dtype
  EXPECT_NO_THROW(route(DType::bf16, 1, w, kPacked, kOther));           // a packed copy is converted
  const std::array<int64_t, 1> size{48}, stride{1};
  EXPECT_THROW(
      Linear::route(DType::f32, 1, TensorView(nullptr, DType::f32, size.data(), stride.data(), 1), kInPlace, kOther),
      ValueError);
  EXPECT_THROW(route(DType::f32, 1, Weight(0, 48, DType::f32), kInPlace, kOther), ValueError);
}

}  // namespace
}  // namespace ember
