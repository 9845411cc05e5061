// The skinny matmul (csrc/skinny/) against a float64 reference at every ISA level this CPU has: fp32 and bf16,
// 1 to 8 rows (to 32 for bf16 on AMX), row counts of w and lengths of k that leave tails at every blocking (1 to 4
// rows of w in flight; 8, 16 or 32 lanes; AMX's passes of one and two 16-row blocks and 32-element k steps), padded
// leading dimensions, bias, every post-op and a residual, f32 and bf16 outputs; the AMX path's packing of x; bitwise
// the same result for any thread count; and the shapes it turns away. ember::Linear's tests cover the path through it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ember/isa.h"
#include "ember/linear.h"
#include "ember/parallel.h"
#include "epilogue_reference.h"
#include "isa_test_util.h"
#include "random_matrix.h"
#include "skinny/skinny_kernels.h"
#include "skinny/skinny_matmul.h"

namespace ember {
namespace {

using testing::Matrix;

// Restores the ISA cap and thread budget a test changes.
struct Restore {
  Isa cap = max_isa();
  int threads = num_threads();
  ~Restore() {
    set_max_isa(cap);
    set_num_threads(threads);
  }
};

struct Shape {
  int64_t m, n, k;
};

void check(DType dtype, DType out_dtype, Shape s, const Epilogue& epilogue, bool with_bias, uint32_t seed) {
  Matrix x(s.m, s.k, dtype, seed, /*pad=*/s.m % 2 ? 5 : 0), w(s.n, s.k, dtype, seed + 1, /*pad=*/s.n % 2 ? 3 : 0);
  Matrix residual(s.m, s.n, out_dtype, seed + 2, 1), out(s.m, s.n, out_dtype, seed + 3, 2);
  std::vector<float> bias;
  if (with_bias) {
    Matrix b(1, s.n, DType::f32, seed + 4);
    bias.assign(b.f32.begin(), b.f32.begin() + s.n);
  }
  const TensorView rv = residual.view();
  // (The kernel runs any number of rows, in groups; ember::Linear routes it only up to max_rows.)
  if (s.m <= skinny::max_rows(dtype)) {
    ASSERT_TRUE(skinny::takes(x.view(), w.view()));
  }
  skinny::matmul(x.view(), w.view(), bias, out.view(), epilogue, has_operand(epilogue) ? &rv : nullptr);
  const double out_rel = out_dtype == DType::bf16 ? 1.0 / 128 : 0.0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const auto [acc, scale] = testing::matmul_reference(x, i, w, j, with_bias ? bias[j] : 0.0, epilogue, residual);
      const double tol = 1e-5 * (scale + 1) + out_rel * std::fabs(acc) + 1e-6;
      ASSERT_NEAR(out.at(i, j), acc, tol) << isa_name(active_isa()) << " " << dtype_name(dtype) << " row " << i
                                          << " col " << j << " of " << s.m << "x" << s.n << "x" << s.k;
    }
  }
}

TEST(SkinnyMatmul, MatchesFloat64AtEveryIsaLevel) {
  const Restore restore;
  const Shape shapes[] = {{1, 1, 1},  {1, 37, 70}, {2, 5, 33},  {3, 64, 129}, {4, 19, 16},   {4, 130, 300}, {1, 3, 31},
                          {5, 9, 40}, {6, 33, 65}, {7, 18, 32}, {8, 67, 100}, {8, 21, 2100}, {3, 17, 4100}};
  const Epilogue epilogues[] = {{},
                                {PostOp::act(Activation::relu)},
                                {PostOp::act(Activation::gelu_erf)},
                                {PostOp::act(Activation::gelu_tanh)},
                                {PostOp::act(Activation::silu)},
                                {PostOp::act(Activation::sigmoid)},
                                {PostOp::act(Activation::tanh)},
                                {PostOp::act(Activation::hardswish)},
                                {PostOp::act(Activation::hardsigmoid)},
                                {PostOp::act(Activation::relu6)},
                                {PostOp::add()},
                                {PostOp::act(Activation::gelu_erf), PostOp::add(), PostOp::act(Activation::relu)},
                                {PostOp::act(Activation::silu), PostOp::multiply()}};
  uint32_t seed = 1;
  for (Isa isa : testing::supported_isas()) {
    set_max_isa(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (DType out : {DType::f32, DType::bf16}) {
        if (dtype == DType::f32 && out == DType::bf16) continue;
        for (const Shape& s : shapes) {
          for (const Epilogue& e : epilogues) {
            seed += 7;
            check(dtype, out, s, e, seed % 3 != 0, seed);
          }
        }
      }
    }
  }
}

// bf16 rows beyond the vector paths' 8, where AMX runs: 16-row blocks of w in passes of two and one with the last
// rows left to AVX512-BF16, one B tile of x (up to 16 rows) and two (17-32, the second full or not), k steps of 32
// with and without a tail, k shorter than a step (the vector paths then take the rows in groups of 8), long k at
// 32, 16 and 4 rows. (The shapes of MatchesFloat64AtEveryIsaLevel cover 2-8 rows on AMX.)
TEST(SkinnyMatmul, Bf16RowsUpToTheAmxTilesAtEveryIsaLevel) {
  const Restore restore;
  const Shape shapes[] = {{9, 16, 32},   {12, 85, 64},  {16, 64, 100},  {16, 33, 96},  {13, 50, 64},
                          {11, 130, 33}, {15, 17, 128}, {10, 5, 31},    {16, 48, 7},   {16, 48, 1600},
                          {4, 40, 6200}, {17, 16, 32},  {24, 85, 96},   {32, 64, 100}, {31, 130, 33},
                          {20, 5, 31},   {32, 48, 7},   {32, 48, 1600}, {27, 33, 64},  {24, 2048, 2048}};
  uint32_t seed = 500;
  for (Isa isa : testing::supported_isas()) {
    set_max_isa(isa);
    for (const Shape& s : shapes) {
      if (s.m > skinny::max_rows(DType::bf16)) continue;
      for (DType out : {DType::f32, DType::bf16}) {
        seed += 7;
        check(DType::bf16, out, s, {PostOp::act(Activation::gelu_erf), PostOp::add()}, seed % 2 == 0, seed);
        check(DType::bf16, out, s, {}, seed % 2 != 0, seed + 1);
      }
    }
  }
}

// x re-laid as an AMX B tile: word (r, i) holds x[i][2r] and x[i][2r + 1] (AVX2 code, so it is checked on any
// AVX2 machine).
TEST(SkinnyMatmul, PacksRowsForAmxTiles) {
  if (detected_isa() < Isa::avx2) GTEST_SKIP() << "the packing is AVX2 code";
  for (int64_t m : {1, 2, 3, 8, 9, 15, 16, 17, 24, 31, 32}) {
    for (int64_t k32 : {32, 64, 160}) {
      const int64_t ldx = k32 + 5, columns = m;
      Matrix x(m, ldx, DType::bf16, static_cast<uint32_t>(m * 1000 + k32));
      std::vector<uint32_t> packed(static_cast<size_t>(k32 / 2 * columns), 0xdeadbeefu);
      skinny::kernels::pack_rows_for_amx(x.bf16.data(), ldx, m, k32, packed.data());
      for (int64_t r = 0; r < k32 / 2; ++r) {
        for (int64_t i = 0; i < columns; ++i) {
          const uint32_t want =
              static_cast<uint32_t>(x.bf16[i * ldx + 2 * r]) | (uint32_t{x.bf16[i * ldx + 2 * r + 1]} << 16);
          ASSERT_EQ(packed[r * columns + i], want) << "m " << m << " k32 " << k32 << " pair " << r << " row " << i;
        }
      }
    }
  }
}

TEST(SkinnyMatmul, RunsAtTheLevelItSays) {
  const Restore restore;
  for (Isa isa : testing::supported_isas()) {
    set_max_isa(isa);
    const Isa vector_bf16 = isa >= Isa::avx512_bf16 ? Isa::avx512_bf16 : isa;
    EXPECT_EQ(skinny::implementation(DType::f32, 4, 64), isa >= Isa::avx512 ? Isa::avx512 : isa);
    EXPECT_EQ(skinny::implementation(DType::bf16, 4, 64), isa >= Isa::amx ? Isa::amx : vector_bf16);
    EXPECT_EQ(skinny::implementation(DType::bf16, 4, 31), vector_bf16);  // k shorter than a tile step
    EXPECT_EQ(skinny::implementation(DType::bf16, 1, 64), vector_bf16);  // one row streams as fast without tiles
    EXPECT_EQ(skinny::max_rows(DType::f32), skinny::kMaxRows);
    EXPECT_EQ(skinny::max_rows(DType::bf16), isa >= Isa::amx ? skinny::kMaxAmxRows : skinny::kMaxRows);
  }
}

TEST(SkinnyMatmul, ThreadCountDoesNotChangeABit) {
  const Restore restore;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = skinny::max_rows(dtype);
    Matrix x(m, 1601, dtype, 1), w(1000, 1601, dtype, 2);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3, 7}) {
      set_num_threads(threads);
      Matrix out(m, 1000, DType::f32, 3);
      skinny::matmul(x.view(), w.view(), {}, out.view(), {}, nullptr);
      results.push_back(out.f32);
    }
    for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << dtype_name(dtype);
  }
}

TEST(SkinnyMatmul, TakesOnlyWhatItWasWrittenFor) {
  Matrix x9(skinny::kMaxRows + 1, 8, DType::f32, 1), x1(1, 8, DType::f32, 2), xb(1, 8, DType::bf16, 3),
      w(6, 8, DType::f32, 4);
  EXPECT_TRUE(skinny::takes(x1.view(), w.view()));
  EXPECT_FALSE(skinny::takes(x9.view(), w.view()));  // more fp32 rows than kMaxRows
  EXPECT_FALSE(skinny::takes(xb.view(), w.view()));  // mixed dtypes
  const int64_t sizes[2] = {6, 8}, strides[2] = {1, 6};
  const TensorView k_strided(w.f32.data(), DType::f32, sizes, strides, 2);
  EXPECT_FALSE(skinny::takes(x1.view(), k_strided));  // w must have unit stride along k
  Matrix x0(0, 8, DType::f32, 5);
  EXPECT_FALSE(skinny::takes(x0.view(), w.view()));
  const int64_t bf16_rows = skinny::max_rows(DType::bf16);  // 32 where AMX runs, else kMaxRows
  Matrix xb_most(bf16_rows, 64, DType::bf16, 6), xb_over(bf16_rows + 1, 64, DType::bf16, 7), wb(64, 64, DType::bf16, 8);
  EXPECT_TRUE(skinny::takes(xb_most.view(), wb.view()));
  EXPECT_FALSE(skinny::takes(xb_over.view(), wb.view()));
}

TEST(SkinnyMatmul, LinearSendsFewRowsOnTheCallersWeightToIt) {
  Matrix w(64, 48, DType::f32, 1);
  const TensorView wv = w.view();
  const Linear plain(wv, nullptr, {DType::f32, false});
  const Linear packed(wv, nullptr, {DType::f32, true});
  EXPECT_EQ(Linear::skinny_rows(DType::f32), skinny::kMaxRows);
  EXPECT_EQ(Linear::skinny_rows(DType::bf16), skinny::max_rows(DType::bf16));
  EXPECT_EQ(plain.implementation(skinny::kMaxRows, &wv).rfind("ember:skinny:", 0), 0u);
  EXPECT_EQ(plain.implementation(skinny::kMaxRows + 1, &wv).find("skinny"), std::string::npos);
  EXPECT_EQ(packed.implementation(1).find("skinny"), std::string::npos);  // the packed copy is oneDNN's layout
}

}  // namespace
}  // namespace ember
