// The tile matmul (csrc/tile_matmul/): the packed layouts it accepts and refuses, the zeroed k padding, and, where
// AMX runs, its results through ember::Linear against a float64 reference: rows that leave every tail of its 32-row
// units (1 to 15 rows of a block, one block of a pair, many pairs), columns that leave a part of a 32-column panel,
// k below, at and past a 32-element step, padded leading dimensions, bias, post-ops and a residual, f32 and bf16
// outputs; the same bits for any thread count; the router's rows; and the calls it refuses. The few-row matmul on
// the same packed copy (AVX512-BF16): rows 1 to 4 against float64, its bits for any thread count, its rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/linear.h"
#include "ember/parallel.h"
#include "epilogue_reference.h"
#include "isa_test_util.h"
#include "random_matrix.h"
#include "tile_matmul/tile_matmul.h"

namespace ember {
namespace {

using testing::Matrix;

TEST(TileMatmul, ReadsOneDnnsAmxLayoutsOnly) {
  // B [k = 100, n = 70] as "16a64b2a": four k steps (100 rounded up to 128), blocks of 64 columns outermost.
  const auto layout = tile_matmul::layout_from_blocking(100, 70, {16, 64, 2}, {0, 1, 0}, 32 * 64, 4 * 32 * 64);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->block_cols, 64);
  EXPECT_EQ(layout->steps(), 4);
  for (int64_t cols : {16, 32, 48}) {
    EXPECT_TRUE(tile_matmul::layout_from_blocking(64, 32, {16, cols, 2}, {0, 1, 0}, 32 * cols, 2 * 32 * cols)) << cols;
  }
  // Blocks that are not whole B tiles or wider than oneDNN makes, another pairing, another order of the blocks,
  // plain, blocks of the other dimension.
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 48, {16, 24, 2}, {0, 1, 0}, 32 * 24, 2 * 32 * 24).has_value());
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 128, {16, 128, 2}, {0, 1, 0}, 32 * 128, 2 * 32 * 128));
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 64, {16, 64, 4}, {0, 1, 0}, 32 * 64, 2 * 32 * 64).has_value());
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 64, {16, 64, 2}, {0, 1, 0}, 64 * 64, 32 * 64).has_value());
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 64, {}, {}, 1, 64).has_value());
  EXPECT_FALSE(tile_matmul::layout_from_blocking(64, 64, {16, 64, 2}, {1, 0, 1}, 32 * 64, 2 * 32 * 64).has_value());
}

TEST(TileMatmul, ZeroesTheKPaddingAndNothingElse) {
  const tile_matmul::PackedLayout layout{70, 37, 64};  // two blocks of two steps, k 32-36 real in the second
  const int64_t step = 32 * 64;
  std::vector<uint16_t> packed(static_cast<size_t>(2 * 2 * step), 0x7fc0);  // bf16 NaN everywhere
  tile_matmul::zero_k_padding(packed.data(), layout);
  for (int64_t block = 0; block < 2; ++block) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t r = 0; r < 16; ++r) {
        for (int64_t c = 0; c < 64; ++c) {
          for (int64_t e = 0; e < 2; ++e) {
            const int64_t kk = s * 32 + 2 * r + e;
            const uint16_t v = packed[static_cast<size_t>((block * 2 + s) * step + (r * 64 + c) * 2 + e)];
            EXPECT_EQ(v, kk < 37 ? 0x7fc0 : 0) << block << " " << kk << " " << c;
          }
        }
      }
    }
  }
}

bool amx_runs() { return active_isa() >= Isa::amx; }

// Restores the thread budget a test changes.
struct RestoreThreads {
  int threads = num_threads();
  ~RestoreThreads() { set_num_threads(threads); }
};

struct Shape {
  int64_t m, n, k;
};

// A prepacked bf16 layer of a random [n, k] weight (bf16 values, given in fp32, as ember.optimize packs an fp32
// model's weights), run on the tile matmul and checked against float64.
void check(Shape s, DType out_dtype, const Epilogue& epilogue, bool with_bias, uint32_t seed,
           LinearKernel kernel = LinearKernel::tiles, int64_t rows_hint = 64) {
  Matrix x(s.m, s.k, DType::bf16, seed, /*pad=*/s.m % 2 ? 5 : 0);
  Matrix w(s.n, s.k, DType::bf16, seed + 1);
  Matrix w32(s.n, s.k, DType::f32, seed + 1);
  for (int64_t r = 0; r < s.n; ++r) {
    for (int64_t c = 0; c < s.k; ++c) w32.set(r, c, static_cast<float>(w.at(r, c)));
  }
  Matrix residual(s.m, s.n, out_dtype, seed + 2, 1), out(s.m, s.n, out_dtype, seed + 3, 2);
  Matrix b(1, s.n, DType::f32, seed + 4);
  const TensorView bias_view(b.f32.data(), DType::f32, {s.n});
  const Linear layer(w32.view(), with_bias ? &bias_view : nullptr, {DType::bf16, true, rows_hint});
  const TensorView rv = residual.view();
  layer.forward_on(kernel, x.view(), nullptr, out.view(), epilogue, has_operand(epilogue) ? &rv : nullptr);
  const double out_rel = out_dtype == DType::bf16 ? 1.0 / 128 : 0.0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const auto [acc, scale] = testing::matmul_reference(x, i, w, j, with_bias ? b.at(0, j) : 0.0, epilogue, residual);
      const double tol = 1e-5 * (scale + 1) + out_rel * std::fabs(acc) + 1e-6;
      ASSERT_NEAR(out.at(i, j), acc, tol)
          << kernel_name(kernel) << " row " << i << " col " << j << " of " << s.m << "x" << s.n << "x" << s.k;
    }
  }
}

TEST(TileMatmul, MatchesFloat64OnEveryTail) {
  if (!amx_runs()) GTEST_SKIP() << "the tile matmul runs on AMX only";
  const Shape shapes[] = {{1, 16, 32},     {15, 33, 64},  {16, 64, 7},   {17, 70, 100}, {31, 32, 33},
                          {32, 100, 96},   {33, 130, 64}, {48, 64, 31},  {64, 96, 768}, {100, 40, 65},
                          {129, 200, 300}, {200, 1, 40},  {384, 64, 64}, {600, 72, 128}};
  const Epilogue epilogues[] = {{},
                                {PostOp::act(Activation::gelu_erf)},
                                {PostOp::add()},
                                {PostOp::act(Activation::silu), PostOp::multiply()},
                                {PostOp::act(Activation::gelu_tanh), PostOp::add(), PostOp::act(Activation::relu)}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (const Epilogue& e : epilogues) {
      for (DType out : {DType::f32, DType::bf16}) {
        seed += 7;
        check(s, out, e, seed % 3 != 0, seed);
      }
    }
  }
}

TEST(TileMatmul, TheSameBitsForAnyThreadCount) {
  if (!amx_runs()) GTEST_SKIP() << "the tile matmul runs on AMX only";
  const RestoreThreads restore;
  const int64_t m = 150, n = 300, k = 200;
  Matrix x(m, k, DType::bf16, 3), w(n, k, DType::f32, 4);
  const Linear layer(w.view(), nullptr, {DType::bf16, true, 64});
  std::vector<Matrix> outs;
  for (int threads : {1, 3, 7, restore.threads}) {
    set_num_threads(threads);
    outs.emplace_back(m, n, DType::f32, 5);
    layer.forward_on(LinearKernel::tiles, x.view(), nullptr, outs.back().view(), {PostOp::act(Activation::gelu_erf)});
  }
  for (size_t i = 1; i < outs.size(); ++i) EXPECT_EQ(outs[i].f32, outs[0].f32) << i;
}

TEST(TileMatmul, TheRouterSendsItBatchOneSequencesOfPackedBf16Layers) {
  if (!Linear::supported(DType::bf16)) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  Matrix w(128, 64, DType::f32, 6);
  const Linear bf16(w.view(), nullptr, {DType::bf16, true, 64}), f32(w.view(), nullptr, {DType::f32, true, 64});
  const auto tiles = [](const Linear& layer, int64_t m) { return layer.implementation(m) == "ember:tiles:amx"; };
  for (int64_t m : {tile_matmul::kMinRows, int64_t{128}, tile_matmul::kMaxRows}) {
    EXPECT_EQ(tiles(bf16, m), amx_runs()) << m;
    EXPECT_FALSE(tiles(f32, m)) << m;
    EXPECT_EQ(Linear::route(DType::bf16, m, w.view(), false, false),
              amx_runs() ? LinearKernel::tiles : LinearKernel::onednn);
  }
  for (int64_t m : {tile_matmul::kMinRows - 1, tile_matmul::kMaxRows + 1}) EXPECT_FALSE(tiles(bf16, m)) << m;
  // Under a cap below AMX the same layer's calls go to oneDNN.
  const testing::ScopedIsaCap cap(Isa::avx512_bf16);
  EXPECT_FALSE(tiles(bf16, 128));
}

// The few-row matmul reads the same packed copy, where AVX512-BF16 runs and oneDNN packed the layer in the layout.
bool few_rows_run(int64_t rows_hint) {
  if (!tile_matmul::few_rows_available(DType::bf16) || !Linear::supported(DType::bf16)) return false;
  Matrix w(64, 64, DType::f32, 1);
  return Linear(w.view(), nullptr, {DType::bf16, true, rows_hint}).implementation(1) == "ember:few_rows:avx512_bf16";
}

TEST(TileMatmul, FewRowsMatchFloat64OnEveryTail) {
  // Rows 1 to 4 (each register blocking), columns that leave a part of a 16-column group and of a block, k odd (the
  // last pair half past the row), below, at and past a 32-element step; layers packed for 1 row and for 64.
  const Shape shapes[] = {{1, 16, 32},   {2, 33, 7},    {3, 50, 1},  {4, 70, 100}, {1, 384, 384},
                          {2, 130, 769}, {3, 1000, 64}, {4, 17, 33}, {4, 4096, 31}};
  const Epilogue epilogues[] = {
      {}, {PostOp::act(Activation::gelu_erf)}, {PostOp::add()}, {PostOp::act(Activation::silu), PostOp::multiply()}};
  bool ran = false;
  uint32_t seed = 3;
  for (int64_t hint : {int64_t{1}, int64_t{64}}) {
    if (!few_rows_run(hint)) continue;
    ran = true;
    for (const Shape& s : shapes) {
      for (const Epilogue& e : epilogues) {
        for (DType out : {DType::f32, DType::bf16}) {
          seed += 7;
          check(s, out, e, seed % 3 != 0, seed, LinearKernel::few_rows, hint);
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no AVX512-BF16, or oneDNN packs bf16 in another layout here";
}

TEST(TileMatmul, FewRowsGiveTheSameBitsForAnyThreadCount) {
  if (!few_rows_run(64)) GTEST_SKIP() << "no AVX512-BF16, or oneDNN packs bf16 in another layout here";
  const RestoreThreads restore;
  const int64_t m = 3, n = 1000, k = 300;
  Matrix x(m, k, DType::bf16, 3), w(n, k, DType::f32, 4);
  const Linear layer(w.view(), nullptr, {DType::bf16, true, 64});
  std::vector<Matrix> outs;
  for (int threads : {1, 3, 7, 16}) {
    set_num_threads(threads);
    outs.emplace_back(m, n, DType::f32, 5);
    layer.forward_on(LinearKernel::few_rows, x.view(), nullptr, outs.back().view(), {PostOp::act(Activation::relu)});
  }
  for (size_t i = 1; i < outs.size(); ++i) EXPECT_EQ(outs[i].f32, outs[0].f32) << i;
}

TEST(TileMatmul, TheRouterSendsItDecodedRowsOfPackedBf16Layers) {
  if (!few_rows_run(64)) GTEST_SKIP() << "no AVX512-BF16, or oneDNN packs bf16 in another layout here";
  Matrix w(128, 64, DType::f32, 6);
  const Linear bf16(w.view(), nullptr, {DType::bf16, true, 64}), f32(w.view(), nullptr, {DType::f32, true, 64});
  for (int64_t m = 1; m <= tile_matmul::kMaxFewRows; ++m) {
    EXPECT_EQ(bf16.implementation(m), "ember:few_rows:avx512_bf16") << m;
    EXPECT_NE(f32.implementation(m), "ember:few_rows:avx512_bf16") << m;
    EXPECT_EQ(Linear::route(DType::bf16, m, w.view(), false, false), LinearKernel::few_rows) << m;
  }
  EXPECT_NE(bf16.implementation(tile_matmul::kMaxFewRows + 1), "ember:few_rows:avx512_bf16");
  // Under a cap below AVX512-BF16 oneDNN takes them.
  const testing::ScopedIsaCap cap(Isa::avx512);
  EXPECT_NE(bf16.implementation(1), "ember:few_rows:avx512_bf16");
}

TEST(TileMatmul, RefusesWhatItCannotRunBeforeWriting) {
  Matrix w(40, 64, DType::f32, 7), x(64, 64, DType::f32, 8), out(64, 40, DType::f32, 9);
  const std::vector<float> before = out.f32;
  const Linear f32(w.view(), nullptr, {DType::f32, true, 64});
  EXPECT_THROW(f32.forward_on(LinearKernel::tiles, x.view(), nullptr, out.view()), ValueError);
  EXPECT_THROW(f32.forward_on(LinearKernel::skinny, x.view(), nullptr, out.view()), ValueError);
  EXPECT_EQ(out.f32, before);
  if (!Linear::supported(DType::bf16)) return;
  Matrix xb(64, 64, DType::bf16, 10);
  const Linear bf16(w.view(), nullptr, {DType::bf16, true, 64});
  {
    const testing::ScopedIsaCap cap(Isa::avx512_bf16);
    EXPECT_THROW(bf16.forward_on(LinearKernel::tiles, xb.view(), nullptr, out.view()), RuntimeError);
  }
  EXPECT_EQ(out.f32, before);
  if (amx_runs()) {
    Matrix tall(tile_matmul::kMaxCallRows + 1, 64, DType::bf16, 11),
        tall_out(tile_matmul::kMaxCallRows + 1, 40, DType::f32, 12);
    const std::vector<float> tall_before = tall_out.f32;
    EXPECT_THROW(bf16.forward_on(LinearKernel::tiles, tall.view(), nullptr, tall_out.view()), ValueError);
    EXPECT_EQ(tall_out.f32, tall_before);
  }
  if (few_rows_run(64)) {
    Matrix over(tile_matmul::kMaxFewRows + 1, 64, DType::bf16, 13),
        over_out(tile_matmul::kMaxFewRows + 1, 40, DType::f32, 14);
    const std::vector<float> over_before = over_out.f32;
    EXPECT_THROW(bf16.forward_on(LinearKernel::few_rows, over.view(), nullptr, over_out.view()), ValueError);
    EXPECT_EQ(over_out.f32, over_before);
    Matrix one(1, 64, DType::bf16, 15), one_out(1, 40, DType::f32, 16);
    const std::vector<float> one_before = one_out.f32;
    {
      const testing::ScopedIsaCap cap(Isa::avx512);
      EXPECT_THROW(bf16.forward_on(LinearKernel::few_rows, one.view(), nullptr, one_out.view()), RuntimeError);
    }
    EXPECT_EQ(one_out.f32, one_before);
  }
  EXPECT_THROW(f32.forward_on(LinearKernel::few_rows, x.view(), nullptr, out.view()), ValueError);
  EXPECT_EQ(out.f32, before);
  // oneDNN's matmul takes any call the router could give it.
  bf16.forward_on(LinearKernel::onednn, xb.view(), nullptr, out.view());
  EXPECT_NE(out.f32, before);
}

}  // namespace
}  // namespace ember
