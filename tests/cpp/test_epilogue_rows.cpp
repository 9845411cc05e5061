// The vector epilogue (csrc/epilogue/) at every ISA level this CPU has: each activation against float64 over the
// whole float range (dense sweeps where the formulas change, magnitudes up to 1e38, zeros, denormals, infinities
// and NaN), bias and a residual add in f32 and bf16 into f32 and bf16 outputs, columns and rows it must leave
// alone, and the same bits for any split of the columns into 16-aligned chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ember/bf16.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/parallel.h"
#include "epilogue/epilogue_rows.h"
#include "epilogue_reference.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::apply;
using testing::example_post_op;
using testing::Matrix;
using testing::ScopedIsaCap;
using testing::supported_isas;

// Inputs: dense around the origin (where tanh switches formula at 0.625 and the GELUs bend), out to where exp
// overflows and underflows (±87..89), magnitudes from denormal to 1e38 of both signs, and the special values.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (int i = -40000; i <= 40000; ++i) xs.push_back(static_cast<float>(i) * 5e-4f);
  for (int i = -2000; i <= 2000; ++i) xs.push_back(static_cast<float>(i) * 0.05f);
  for (float x = 85.0f; x < 90.0f; x += 0.01f) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  for (float mag = 1e-44f; mag < 1e38f; mag *= 1.7f) {
    xs.push_back(mag);
    xs.push_back(-mag);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.625f, -0.625f,
                  std::nextafter(0.625f, 0.0f), 3.0f, -3.0f, 6.0f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::lowest(), std::numeric_limits<float>::denorm_min()}) {
    xs.push_back(x);
  }
  return xs;
}

// The spacing of floats at |value| (2^-149 among the denormals).
double ulp_of(double value) {
  const float f = std::fabs(static_cast<float>(value));
  if (f < std::numeric_limits<float>::min()) return std::numeric_limits<float>::denorm_min();
  return std::ldexp(1.0, std::ilogb(f) - 23);
}

// Results this small may come out as zero: e^x is flushed below 2.4e-38 and overflows above 3.4e38, and SiLU and
// the GELUs divide x by it (|x|·e^-|x| < 3e-37 wherever e^|x| overflows).
constexpr double kFlushed = 3e-37;

// What each activation may be off by, beside kFlushed: a few ulp of the result for the exp-based ones; for the
// tanh GELU also the rounding of its exponent -2u, computed in fp32 (a relative error of |2u| times a few ε in
// e^-2u: 1e-5 at x = -9.5, where the result is 1e-32); and for the erf GELU 0.5·|x| times the error of erfc,
// Abramowitz and Stegun's 1.5e-7 plus the rounding of its fp32 evaluation.
double tolerance(Activation act, double x, double want) {
  constexpr double kEps = 1.0 / (1 << 23);
  switch (act) {
    case Activation::relu:
    case Activation::relu6: return kFlushed;
    case Activation::hardswish:
    case Activation::hardsigmoid:
    case Activation::tanh: return 2 * ulp_of(want) + kFlushed;
    case Activation::sigmoid:
    case Activation::silu: return 4 * ulp_of(want) + kFlushed;
    case Activation::gelu_tanh: {
      const double two_u = 2 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      return 8 * ulp_of(want) + std::fabs(want * two_u) * 2 * kEps + kFlushed;
    }
    case Activation::gelu_erf: return 0.5 * std::fabs(x) * 5e-7 + 4 * ulp_of(want) + kFlushed;
    case Activation::clamp:
    case Activation::affine: return kFlushed;  // the reference rounds as torch does
    case Activation::leaky_relu: return ulp_of(want) + kFlushed;
    case Activation::elu: return 8 * ulp_of(want) + kFlushed;
    // Mish is about x·eˣ far below 0, and simd_math::exp flushes results below about 2.4e-38 to 0: the result is
    // then 0 where it is at most |x|·2.4e-38.
    case Activation::mish: return 8 * ulp_of(want) + kFlushed + std::fabs(x) * 2.4e-38;
  }
  return kFlushed;
}

TEST(EpilogueRows, EachActivationMatchesFloat64OverTheFloatRange) {
  const std::vector<float> xs = sweep();
  const int64_t n = static_cast<int64_t>(xs.size());
  const int64_t sizes[2] = {1, n}, strides[2] = {n, 1};
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    for (Activation act : kAllActivations) {
      std::vector<float> out(xs.size());
      const TensorView out_view(out.data(), DType::f32, sizes, strides, 2);
      const PostOp op = example_post_op(act);
      epilogue::finish_rows(xs.data(), n, 1, 0, n, nullptr, {op}, nullptr, out_view);
      for (int64_t j = 0; j < n; ++j) {
        const double x = xs[j], got = out[j];
        double want = apply(op, x);
        // torch's order in fp32, x·relu6(x + 3) / 6, overflows from x = FLT_MAX / 6; ember keeps that order.
        if (act == Activation::hardswish && 6 * x > std::numeric_limits<float>::max()) want = HUGE_VAL;
        const bool ok = std::isnan(want)   ? std::isnan(got)
                        : std::isinf(want) ? got == want
                                           : std::fabs(got - want) <= tolerance(act, x, want);
        if (!ok) {
          std::ostringstream where;
          where.precision(9);
          where << isa_name(isa) << " " << activation_name(act) << "(" << x << ") = " << got << ", want " << want
                << ", tolerance " << tolerance(act, x, want);
          FAIL() << where.str();
        }
      }
    }
  }
}

// bias + residual (added or multiplied) + activations in a chain, f32 and bf16 operands and outputs, widths that leave
// a tail at 8 and 16 lanes, rows with padding: the stored values match a float64 reference (bf16 outputs to their
// rounding), and nothing outside columns [n0, n1) of the m rows is written.
TEST(EpilogueRows, BiasResidualAndStoreMatchFloat64AndWriteOnlyTheirColumns) {
  const Epilogue chains[] = {{},
                             {PostOp::act(Activation::relu6)},
                             {PostOp::add()},
                             {PostOp::act(Activation::gelu_erf), PostOp::add()},
                             {PostOp::add(), PostOp::act(Activation::silu), PostOp::act(Activation::tanh)},
                             {PostOp::multiply()},
                             {PostOp::act(Activation::silu), PostOp::multiply()},
                             {PostOp::act(Activation::gelu_tanh), PostOp::multiply(), PostOp::act(Activation::relu)}};
  const int64_t ranges[][2] = {{0, 1}, {0, 16}, {16, 61}, {32, 33}, {0, 100}};
  uint32_t seed = 10;
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    for (DType out_dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (DType residual_dtype : {DType::f32, DType::bf16, DType::f16}) {
        for (const Epilogue& chain : chains) {
          for (const auto& range : ranges) {
            const int64_t m = 3, width = 100, n0 = range[0], n1 = range[1];
            seed += 5;
            Matrix sums(m, n1 - n0, DType::f32, seed, /*pad=*/2), bias(1, width, DType::f32, seed + 1);
            Matrix residual(m, width, residual_dtype, seed + 2, 3), out(m, width, out_dtype, seed + 3, 1);
            const Matrix before = out;
            const bool with_bias = seed % 2 == 0;
            const TensorView rv = residual.view();
            epilogue::finish_rows(sums.f32.data(), sums.ld, m, n0, n1, with_bias ? bias.f32.data() : nullptr, chain,
                                  &rv, out.view());
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < out.ld; ++j) {
                if (j < n0 || j >= n1) {  // untouched, the padding column included
                  ASSERT_EQ(out.at(i, j), before.at(i, j)) << isa_name(isa) << " row " << i << " col " << j;
                  continue;
                }
                double want = sums.at(i, j - n0) + (with_bias ? bias.at(0, j) : 0.0);
                for (const PostOp& op : chain) {
                  want = op.kind == PostOp::Kind::add        ? want + residual.at(i, j)
                         : op.kind == PostOp::Kind::multiply ? want * residual.at(i, j)
                                                             : apply(op, want);
                }
                // A rounding to bf16 (8 bits) or binary16 (11 bits, then 2^-24 apart below 2^-14; past 65504,
                // infinity).
                const double tol = out_dtype == DType::bf16  ? std::fabs(want) / 256 + 1e-6
                                   : out_dtype == DType::f16 ? std::fabs(want) / 2048 + 0x1p-24
                                                             : 1e-6 * std::fabs(want) + 1e-6;
                if (out_dtype == DType::f16 && std::fabs(want) >= 65520.0) {
                  ASSERT_TRUE(std::isinf(out.at(i, j)));
                  continue;
                }
                ASSERT_NEAR(out.at(i, j), want, tol)
                    << isa_name(isa) << " row " << i << " col " << j << " of [" << n0 << ", " << n1 << ")";
              }
            }
          }
        }
      }
    }
  }
}

TEST(EpilogueRows, ColumnSplitsAtMultiplesOf16GiveTheSameBits) {
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    const int64_t m = 2, n = 203;
    Matrix sums(m, n, DType::f32, 7), bias(1, n, DType::f32, 8);
    const Epilogue chain = {PostOp::act(Activation::gelu_erf), PostOp::act(Activation::sigmoid)};
    Matrix whole(m, n, DType::bf16, 9), split(m, n, DType::bf16, 9);
    epilogue::finish_rows(sums.f32.data(), sums.ld, m, 0, n, bias.f32.data(), chain, nullptr, whole.view());
    const int64_t cuts[] = {0, 16, 48, 64, 192, n};
    for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
      epilogue::finish_rows(sums.f32.data() + cuts[c], sums.ld, m, cuts[c], cuts[c + 1], bias.f32.data(), chain,
                            nullptr, split.view());
    }
    EXPECT_EQ(whole.bf16, split.bf16) << isa_name(isa);
  }
}

// finish_from over every layout a oneDNN layer may write (row-major, channels-last, a transposed view, a view with
// no unit stride), in place and from a row-major f32 source, with residuals in the same or another layout, into
// f32 and bf16: each element comes out as finish_rows makes it from the same numbers in one dense row, NaN and
// infinities included, nothing between the elements is written, and the thread count changes no bit. The chains
// are of post-ops that round once (add, multiply, relu, relu6, hardsigmoid), so every lane path gives the same bits.
TEST(EpilogueRows, FinishFromMatchesFinishRowsOnEveryLayout) {
  const std::vector<int64_t> sizes = {2, 3, 5, 37};  // 1110 elements: more than one 1024-element span
  const int64_t numel = 2 * 3 * 5 * 37;
  const std::vector<std::vector<int64_t>> layouts = {
      {555, 185, 37, 1},   // row-major
      {555, 1, 111, 3},    // channels-last
      {1, 2, 6, 30},       // column-major: unit stride along the first dimension only
      {1110, 370, 74, 2},  // every other element: no unit stride anywhere
  };
  // A single activation takes a one-pass path of its own; a bf16 ReLU or ReLU6 in place stores without rounding.
  const Epilogue chains[] = {{PostOp::add(), PostOp::act(Activation::relu)},
                             {PostOp::act(Activation::relu6), PostOp::add(), PostOp::act(Activation::hardsigmoid)},
                             {PostOp::act(Activation::relu)},
                             {PostOp::act(Activation::relu6)},
                             {PostOp::act(Activation::relu), PostOp::multiply()}};
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), -0.0f,
                           testing::to_bf16_and_back(3e38f),        testing::to_bf16_and_back(-3e38f)};
  Matrix values(1, numel, DType::bf16, 21), residual_values(1, numel, DType::bf16, 22);  // exact in bf16 and f32
  for (size_t i = 0; i < std::size(special); ++i) {
    values.f32[i * 97] = special[i];
    residual_values.f32[i * 89 + 40] = special[i];
  }
  // The offset under `strides` of the element at row-major position `flat`.
  const auto offset = [&](int64_t flat, const std::vector<int64_t>& strides) {
    int64_t off = 0;
    for (int d = 3; d >= 0; --d) {
      off += flat % sizes[d] * strides[d];
      flat /= sizes[d];
    }
    return off;
  };
  const TensorView source(values.f32.data(), DType::f32, sizes.data(), layouts[0].data(), 4);
  const int saved = num_threads();
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    for (DType out_dtype : {DType::f32, DType::bf16}) {
      for (const Epilogue& chain : chains) {
        Matrix want(1, numel, out_dtype, 0);
        const TensorView residual_row(residual_values.f32.data(), DType::f32, {1, numel});
        epilogue::finish_rows(values.f32.data(), numel, 1, 0, numel, nullptr, chain, &residual_row, want.view());
        for (const auto& out_strides : layouts) {
          for (const auto& residual_strides : {out_strides, layouts[1]}) {
            for (bool in_place : {true, false}) {
              for (int threads : {1, 7}) {
                set_num_threads(threads);
                std::vector<float> out_f32(2 * numel, -1.0f), residual(2 * numel, -1.0f);
                std::vector<uint16_t> out_bf16(2 * numel, 0xBF80);  // -1.0: the gaps must stay so
                for (int64_t f = 0; f < numel; ++f) {
                  out_f32[offset(f, out_strides)] = values.f32[f];
                  out_bf16[offset(f, out_strides)] = static_cast<uint16_t>(bf16::float_bits(values.f32[f]) >> 16);
                  residual[offset(f, residual_strides)] = residual_values.f32[f];
                }
                void* out_data = out_dtype == DType::bf16 ? static_cast<void*>(out_bf16.data()) : out_f32.data();
                const TensorView out(out_data, out_dtype, sizes.data(), out_strides.data(), 4);
                const TensorView res(residual.data(), DType::f32, sizes.data(), residual_strides.data(), 4);
                epilogue::finish_from(chain, in_place ? out : source, &res, out);
                std::vector<bool> visited(2 * numel, false);
                for (int64_t f = 0; f < numel; ++f) {
                  const int64_t at = offset(f, out_strides);
                  visited[at] = true;
                  const double got = out_dtype == DType::bf16 ? bf16::widen(out_bf16[at]) : out_f32[at];
                  const double expected = want.at(0, f);
                  ASSERT_TRUE(std::isnan(expected) ? std::isnan(got) : got == expected)
                      << isa_name(isa) << " " << dtype_name(out_dtype) << (in_place ? " in place" : " from f32")
                      << " strides " << out_strides[3] << ", " << threads << " threads, element " << f << ": " << got
                      << ", want " << expected;
                }
                for (int64_t at = 0; at < 2 * numel; ++at) {
                  const double stored = out_dtype == DType::bf16 ? bf16::widen(out_bf16[at]) : out_f32[at];
                  if (!visited[at]) {
                    ASSERT_EQ(stored, -1.0) << "a gap at " << at << " was written";
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  set_num_threads(saved);
}

// binary16 storage against the compiler's own conversions (libgcc's, not ember's): every half widens exactly and
// comes back as the same bits, and float32 values (ties, subnormals, the overflow boundary, specials, random ones)
// round to the half the compiler rounds them to, at every ISA level and in the vector lanes and the tail alike.
TEST(EpilogueRows, HalfStorageMatchesTheCompilersBinary16) {
  std::vector<float> values;
  for (uint32_t h = 0; h < 0x10000U; ++h) {
    _Float16 half;
    const auto bits = static_cast<uint16_t>(h);
    std::memcpy(&half, &bits, sizeof half);
    values.push_back(static_cast<float>(half));
  }
  const size_t halves = values.size();
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t b = any_bits(rng);
    float f;
    std::memcpy(&f, &b, sizeof f);
    values.push_back(f);
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e6f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f,
                  1.0f + 0x1p-11f, 1.0f + 0x3p-11f, -0.0f, std::numeric_limits<float>::infinity()}) {
    values.push_back(f);
    values.push_back(-f);
  }
  const auto n = static_cast<int64_t>(values.size());
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    std::vector<_Float16> out(values.size());
    const TensorView out_view(out.data(), DType::f16, {1, n});
    epilogue::finish_rows(values.data(), n, 1, 0, n, nullptr, {}, nullptr, out_view);
    for (size_t i = 0; i < values.size(); ++i) {
      const _Float16 want = static_cast<_Float16>(values[i]);
      uint16_t got_bits, want_bits;
      std::memcpy(&got_bits, &out[i], sizeof got_bits);
      std::memcpy(&want_bits, &want, sizeof want_bits);
      if (std::isnan(values[i])) {
        ASSERT_TRUE(std::isnan(static_cast<float>(out[i]))) << isa_name(isa) << " value " << i;
      } else {
        ASSERT_EQ(got_bits, want_bits) << isa_name(isa) << " value " << values[i] << (i < halves ? " (a half)" : "");
      }
    }
    // And back: each half read as the epilogue's sums (in place) keeps its bits.
    std::vector<_Float16> round_trip(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(halves));
    const TensorView rt(round_trip.data(), DType::f16, {1, static_cast<int64_t>(halves)});
    epilogue::finish_from({PostOp::act(Activation::affine, 1.0f, 0.0f)}, rt, nullptr, rt);
    for (size_t h = 0; h < halves; ++h) {
      uint16_t got;
      std::memcpy(&got, &round_trip[h], sizeof got);
      if (std::isnan(values[h])) continue;
      ASSERT_EQ(got, h) << isa_name(isa);
    }
  }
}

// bf16 storage against ember::bf16::round_bits, bit for bit, at every ISA level: random bit patterns (NaN payloads,
// infinities, denormals), vectors where one denormal sits among normal values (the AVX512-BF16 store converts with
// vcvtneps2bf16, which reads denormals as zero, and must hand such a vector to the bit arithmetic), rounding ties,
// and the overflow boundary.
TEST(EpilogueRows, Bf16StorageRoundsAsRoundBits) {
  std::vector<uint32_t> bits;
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 40000; ++i) bits.push_back(any_bits(rng));
  for (int v = 0; v < 64; ++v) {  // a denormal at lane v % 16 of a vector of normal values
    for (int lane = 0; lane < 16; ++lane) {
      bits.push_back(lane == v % 16 ? (any_bits(rng) & 0x807FFFFFU) | 1U : 0x3F800000U + (any_bits(rng) & 0xFFFFU));
    }
  }
  for (uint32_t b : {0x3F808000U, 0x3F818000U, 0x3F808001U, 0x7F7FFFFFU, 0x7F7F8000U, 0x7F800001U, 0xFFFFFFFFU,
                     0x7FA00000U, 0x00008000U, 0x00018000U, 0x007FFFFFU, 0x00800000U, 0x80000000U, 0x7F800000U}) {
    bits.push_back(b);
    bits.push_back(b ^ 0x80000000U);
  }
  const auto n = static_cast<int64_t>(bits.size());
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    std::vector<uint16_t> out(bits.size());
    const TensorView out_view(out.data(), DType::bf16, {1, n});
    epilogue::finish_rows(values.data(), n, 1, 0, n, nullptr, {}, nullptr, out_view);
    for (size_t i = 0; i < bits.size(); ++i) {
      ASSERT_EQ(out[i], bf16::round_bits(bits[i])) << isa_name(isa) << " bits 0x" << std::hex << bits[i];
    }
  }
}

TEST(EpilogueRows, RunsAtTheWidestLevelItHas) {
  for (Isa isa : supported_isas()) {
    const ScopedIsaCap cap(isa);
    const Isa want = isa >= Isa::avx512_bf16 ? Isa::avx512_bf16
                     : isa >= Isa::avx512    ? Isa::avx512
                     : isa >= Isa::avx2      ? Isa::avx2
                                             : Isa::ref;
    EXPECT_EQ(epilogue::implementation(), want);
  }
}

TEST(Epilogue, ParametersAreCheckedByWhatEachActivationTakes) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto ok = [](const Epilogue& e) { EXPECT_NO_THROW(check_epilogue("op", e)); };
  const auto bad = [](const Epilogue& e) { EXPECT_THROW(check_epilogue("op", e), ValueError); };
  for (Activation act : kAllActivations) ok({example_post_op(act)});
  ok({PostOp::act(Activation::clamp, 0.0f, inf)});
  ok({PostOp::act(Activation::clamp, -inf, 3.0f)});
  ok({PostOp::act(Activation::clamp, 1.0f, 1.0f)});
  bad({PostOp::act(Activation::clamp, 2.0f, 1.0f)});
  bad({PostOp::act(Activation::clamp, nan, 1.0f)});
  bad({PostOp::act(Activation::relu, 1.0f)});         // takes no parameter
  bad({PostOp::act(Activation::elu, 1.0f, 2.0f)});    // takes one
  bad({PostOp::act(Activation::leaky_relu, inf)});    // not finite
  bad({PostOp::act(Activation::affine, 1.0f, nan)});  // not finite
  bad({PostOp::add(), PostOp::act(Activation::relu), PostOp::add()});
  bad({PostOp::multiply(), PostOp::add()});  // one operand for both
  bad({PostOp::multiply(), PostOp::multiply()});
  ok({PostOp::act(Activation::silu), PostOp::multiply(), PostOp::act(Activation::relu)});
  EXPECT_FALSE(PostOp::add() == PostOp::multiply());
  EXPECT_FALSE(PostOp::act(Activation::elu, 1.0f) == PostOp::act(Activation::elu, 0.5f));
  EXPECT_TRUE(PostOp::act(Activation::elu, 1.0f) == PostOp::act(Activation::elu, 1.0f));
}

}  // namespace
}  // namespace ember
