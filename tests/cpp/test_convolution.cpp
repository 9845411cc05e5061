// ember::Convolution against a float64 reference on random inputs: 1-D, 2-D and 3-D, groups (depthwise too),
// strides, dilations, asymmetric padding, transposed convolutions, channels-first and channels-last activations,
// each post-op, bias or none, several input shapes through one layer (the primitive cache and the one packed
// copy), and the refusals, which must leave the output untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "concurrent_calls.h"
#include "ember/bf16.h"
#include "ember/convolution.h"
#include "ember/cpu_features.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "epilogue_reference.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::ChainReference;
using testing::example_post_op;
using testing::reference_chain;
using testing::to_bf16_and_back;

// An N-D tensor of values exact in its dtype, dense in some order of its dimensions: row-major, or channels-last
// (dimension 1 innermost).
struct Tensor {
  std::vector<int64_t> sizes, strides;
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<_Float16> f16;  // the compiler's binary16

  Tensor(std::vector<int64_t> shape, DType dt, uint32_t seed, bool channels_last = false)
      : sizes(std::move(shape)), strides(sizes.size()), dtype(dt) {
    const int nd = static_cast<int>(sizes.size());
    std::vector<int> order(static_cast<size_t>(nd));  // innermost last
    std::iota(order.begin(), order.end(), 0);
    if (channels_last && nd > 2) std::rotate(order.begin() + 1, order.begin() + 2, order.end());
    int64_t step = 1;
    for (int i = nd - 1; i >= 0; --i) {
      strides[order[i]] = step;
      step *= sizes[order[i]];
    }
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    f32.resize(static_cast<size_t>(std::max<int64_t>(step, 1)));
    for (float& v : f32) v = to_bf16_and_back(normal(rng));  // exact in both dtypes
    if (dtype == DType::bf16) {
      bf16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) bf16[i] = static_cast<uint16_t>(::ember::bf16::float_bits(f32[i]) >> 16);
    }
    if (dtype == DType::f16) {  // (bf16-exact values below 2^-14 round to f16 subnormals: f32 keeps what f16 holds)
      f16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(f16[i] = static_cast<_Float16>(f32[i]));
    }
  }
  int64_t offset(const std::vector<int64_t>& idx) const {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
    return off;
  }
  /// Sets the element at `idx` in both views (`value` should be exact in bf16 for a bf16 tensor).
  void set(const std::vector<int64_t>& idx, float value) {
    const int64_t off = offset(idx);
    f32[off] = value;
    if (dtype == DType::bf16) bf16[off] = static_cast<uint16_t>(::ember::bf16::float_bits(value) >> 16);
    if (dtype == DType::f16) f16[off] = static_cast<_Float16>(value);
  }
  double at(const std::vector<int64_t>& idx) const {
    const int64_t off = offset(idx);
    if (dtype == DType::f16) return static_cast<double>(f16[off]);
    return dtype == DType::bf16 ? ::ember::bf16::widen(bf16[off]) : f32[off];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  TensorView view() {
    void* data = dtype == DType::bf16  ? static_cast<void*>(bf16.data())
                 : dtype == DType::f16 ? static_cast<void*>(f16.data())
                                       : static_cast<void*>(f32.data());
    return TensorView(data, dtype, sizes.data(), strides.data(), static_cast<int>(sizes.size()));
  }
};

// Calls f(index) for every index of `sizes`, row-major.
template <typename F>
void for_each_index(const std::vector<int64_t>& sizes, F&& f) {
  int64_t total = 1;
  for (int64_t s : sizes) total *= s;
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    f(idx);
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// The convolution (or transposed convolution) in float64, before the epilogue, and the sum of |terms| per output
// element (the scale of its rounding error).
void reference(const Tensor& x, const Tensor& w, const std::vector<float>* bias, const Convolution::Geometry& g,
               const std::vector<int64_t>& out_shape, std::vector<double>& value, std::vector<double>& scale) {
  const int spatial = static_cast<int>(x.sizes.size()) - 2;
  int64_t out_total = 1;
  for (int64_t s : out_shape) out_total *= s;
  value.assign(static_cast<size_t>(out_total), 0.0);
  scale.assign(static_cast<size_t>(out_total), 0.0);
  auto flat = [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off = off * out_shape[d] + idx[d];
    return off;
  };
  const int64_t groups = g.groups;
  const int64_t in_c = x.sizes[1];
  const int64_t out_c = out_shape[1];
  const std::vector<int64_t> kernel(w.sizes.begin() + 2, w.sizes.end());
  // Input position i and kernel tap k meet at output o: o*s - pl + k*d = i (convolution), o = i*s - pl + k*d
  // (transposed). Walk every (input, output channel, tap) and scatter.
  for_each_index(x.sizes, [&](const std::vector<int64_t>& xi) {
    const int64_t c = xi[1], group = c / (in_c / groups), c_in_group = c % (in_c / groups);
    for (int64_t oc_in_group = 0; oc_in_group < out_c / groups; ++oc_in_group) {
      const int64_t oc = group * (out_c / groups) + oc_in_group;
      for_each_index(kernel, [&](const std::vector<int64_t>& k) {
        std::vector<int64_t> oi{xi[0], oc};
        for (int d = 0; d < spatial; ++d) {
          int64_t pos = 0;
          if (g.transposed) {
            pos = xi[2 + d] * g.stride[d] - g.padding_l[d] + k[d] * g.dilation[d];
          } else {
            const int64_t num = xi[2 + d] + g.padding_l[d] - k[d] * g.dilation[d];
            if (num < 0 || num % g.stride[d] != 0) return;
            pos = num / g.stride[d];
          }
          if (pos < 0 || pos >= out_shape[2 + d]) return;
          oi.push_back(pos);
        }
        std::vector<int64_t> wi =
            g.transposed ? std::vector<int64_t>{c, oc_in_group} : std::vector<int64_t>{oc, c_in_group};
        wi.insert(wi.end(), k.begin(), k.end());
        const double term = x.at(xi) * w.at(wi);
        value[flat(oi)] += term;
        scale[flat(oi)] += std::fabs(term);
      });
    }
  });
  if (bias != nullptr) {
    for_each_index(out_shape, [&](const std::vector<int64_t>& oi) {
      value[flat(oi)] += (*bias)[oi[1]];
      scale[flat(oi)] += std::fabs((*bias)[oi[1]]);
    });
  }
}

struct Case {
  const char* name;
  std::vector<int64_t> weight;  // torch's layout
  std::vector<std::vector<int64_t>> inputs;
  Convolution::Geometry geometry;
};

std::vector<Case> geometry_cases() {
  return {
      {"conv1d", {6, 4, 3}, {{2, 4, 9}, {1, 4, 5}}, {{1}, {1}, {1}, {1}, 1, false}},
      {"conv1d_strided_dilated", {8, 2, 3}, {{2, 4, 17}}, {{2}, {2}, {1}, {2}, 2, false}},
      {"conv2d_3x3",
       {16, 8, 3, 3},
       {{2, 8, 7, 6}, {1, 8, 5, 5}, {3, 8, 9, 4}},
       {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, false}},
      {"conv2d_1x1_strided", {12, 8, 1, 1}, {{2, 8, 8, 8}}, {{2, 2}, {0, 0}, {0, 0}, {1, 1}, 1, false}},
      {"conv2d_stem_7x7", {8, 3, 7, 7}, {{1, 3, 16, 16}}, {{2, 2}, {3, 3}, {3, 3}, {1, 1}, 1, false}},
      {"conv2d_depthwise", {16, 1, 3, 3}, {{2, 16, 6, 7}}, {{1, 2}, {1, 1}, {1, 1}, {1, 1}, 16, false}},
      {"conv2d_grouped_asymmetric", {12, 2, 3, 2}, {{1, 8, 7, 8}}, {{1, 1}, {0, 1}, {2, 0}, {2, 1}, 4, false}},
      {"conv3d",
       {6, 4, 3, 3, 3},
       {{1, 4, 5, 6, 5}, {2, 4, 4, 4, 4}},
       {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1, false}},
      {"conv_transpose2d", {8, 6, 3, 3}, {{2, 8, 5, 4}, {1, 8, 3, 3}}, {{2, 2}, {1, 1}, {0, 0}, {1, 1}, 1, true}},
      {"conv_transpose2d_grouped", {8, 3, 4, 4}, {{1, 8, 4, 5}}, {{2, 2}, {1, 1}, {1, 1}, {1, 1}, 2, true}},
      {"conv_transpose1d_dilated", {4, 6, 3}, {{2, 4, 7}}, {{3}, {2}, {1}, {2}, 1, true}},
  };
}

void check_layer(const Case& c, DType compute, const Epilogue& epilogue, bool with_bias, bool channels_last,
                 DType out_dtype) {
  Tensor w(c.weight, DType::f32, 1);  // the model's fp32 weight; a bf16 or f16 layer rounds it once when packing
  if (compute == DType::bf16) {
    for (float& v : w.f32) v = to_bf16_and_back(v);
  }
  if (compute == DType::f16) {
    for (float& v : w.f32) v = static_cast<float>(static_cast<_Float16>(v));
  }
  const int64_t out_c = c.geometry.transposed ? c.weight[1] * c.geometry.groups : c.weight[0];
  Tensor b({out_c}, DType::f32, 2);
  std::vector<float> bias(b.f32.begin(), b.f32.end());
  const TensorView bias_view = b.view();
  Tensor hint(c.inputs[0], compute, 3, channels_last);
  const Convolution layer(w.view(), with_bias ? &bias_view : nullptr, c.geometry, {compute}, hint.view());
  const size_t packed = layer.packed_bytes();
  EXPECT_GE(packed, static_cast<size_t>(w.numel()) * dtype_size(compute));
  uint32_t seed = 10;
  for (const auto& shape : c.inputs) {
    Tensor x(shape, compute, seed++, channels_last);
    const std::vector<int64_t> out_shape = layer.output_shape(shape);
    Tensor out(out_shape, out_dtype, seed++, channels_last);
    Tensor residual(out_shape, DType::f32, seed++, !channels_last);  // the other layout: strides are free
    const TensorView rv = residual.view();
    layer.forward(x.view(), out.view(), epilogue, has_operand(epilogue) ? &rv : nullptr);
    std::vector<double> value, scale;
    reference(x, w, with_bias ? &bias : nullptr, c.geometry, out_shape, value, scale);
    const double out_rel = out_dtype == DType::bf16 ? 1.0 / 128 : out_dtype == DType::f16 ? 1.0 / 1024 : 0.0;
    int64_t flat = 0;
    for_each_index(out_shape, [&](const std::vector<int64_t>& oi) {
      const double acc = value[flat];
      double err = scale[flat];
      ++flat;
      if (has_operand(epilogue)) err += std::fabs(residual.at(oi));
      const ChainReference want = reference_chain(epilogue, acc, residual.at(oi));
      const double slack = out_dtype != DType::f32 ? want.bf16_slack : 0.0;  // (over twice enough for f16)
      const double tol = 1e-5 * (err + 1) + out_rel * std::fabs(want.value) + slack + 1e-6;
      ASSERT_NEAR(out.at(oi), want.value, tol) << c.name << " at flat index " << flat - 1;
    });
  }
  EXPECT_EQ(layer.cached_primitives(), c.inputs.size());  // one per shape; construction only packs
  EXPECT_LE(layer.packed_bytes(), 2 * packed) << "more than two layouts for one weight";
}

struct Param {
  DType compute;
  bool channels_last;
};

class ConvolutionTest : public ::testing::TestWithParam<Param> {};

TEST_P(ConvolutionTest, EveryGeometryMatchesFloat64Reference) {
  const Param p = GetParam();
  if (!Convolution::supported(p.compute)) GTEST_SKIP() << "oneDNN has no " << dtype_name(p.compute) << " here";
  for (const Case& c : geometry_cases()) check_layer(c, p.compute, {}, true, p.channels_last, p.compute);
}

TEST_P(ConvolutionTest, EveryEpilogueMatchesFloat64Reference) {
  const Param p = GetParam();
  if (!Convolution::supported(p.compute)) GTEST_SKIP() << "oneDNN has no " << dtype_name(p.compute) << " here";
  const Case c = geometry_cases()[2];
  for (Activation act : kAllActivations) {
    check_layer(c, p.compute, {example_post_op(act)}, true, p.channels_last, p.compute);
  }
  check_layer(c, p.compute, {PostOp::add(), PostOp::act(Activation::relu)}, false, p.channels_last, p.compute);
  check_layer(geometry_cases()[8], p.compute, {PostOp::add()}, true, p.channels_last, p.compute);
  check_layer(geometry_cases()[8], p.compute, {PostOp::act(Activation::sigmoid), PostOp::multiply()}, true,
              p.channels_last, p.compute);
  if (p.compute == DType::bf16)
    check_layer(c, p.compute, {PostOp::act(Activation::silu)}, true, p.channels_last, DType::f32);
}

// A residual that is the output itself (the same memory and layout) is added in place (oneDNN's sum post-op, not its
// binary add): the result of the residual read from a tensor of its own, to the rounding of the output's dtype (the
// sum post-op adds the bias and the residual in another order).
TEST_P(ConvolutionTest, AResidualThatIsTheOutputIsAddedInPlace) {
  const Param p = GetParam();
  if (!Convolution::supported(p.compute)) GTEST_SKIP() << "oneDNN has no " << dtype_name(p.compute) << " here";
  for (const int index : {2, 8}) {  // a 3x3 convolution, a transposed one
    const Case c = geometry_cases()[index];
    const int64_t out_c = c.geometry.transposed ? c.weight[1] * c.geometry.groups : c.weight[0];
    Tensor w(c.weight, DType::f32, 1), b({out_c}, DType::f32, 2);
    const TensorView bias = b.view();
    Tensor hint(c.inputs[0], p.compute, 3, p.channels_last);
    const Convolution layer(w.view(), &bias, c.geometry, {p.compute}, hint.view());
    Tensor x(c.inputs[0], p.compute, 4, p.channels_last);
    const std::vector<int64_t> out_shape = layer.output_shape(c.inputs[0]);
    const double ulp = p.compute == DType::bf16 ? 1.0 / 128 : p.compute == DType::f16 ? 1.0 / 1024 : 1e-6;
    for (const Epilogue& epilogue : {Epilogue{PostOp::add()}, Epilogue{PostOp::add(), PostOp::act(Activation::relu)}}) {
      Tensor residual(out_shape, p.compute, 5, p.channels_last), apart(out_shape, p.compute, 6, p.channels_last);
      Tensor in_place = residual;  // the residual, to be overwritten by the output
      const TensorView rv = residual.view(), iv = in_place.view();
      layer.forward(x.view(), apart.view(), epilogue, &rv);
      layer.forward(x.view(), iv, epilogue, &iv);
      for_each_index(out_shape, [&](const std::vector<int64_t>& oi) {
        const double want = apart.at(oi);
        ASSERT_NEAR(in_place.at(oi), want, ulp * (std::fabs(want) + 1))
            << c.name << " " << epilogue.size() << " post-ops";
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConvolutionTest,
                         ::testing::Values(Param{DType::f32, false}, Param{DType::f32, true}, Param{DType::bf16, false},
                                           Param{DType::bf16, true}, Param{DType::f16, false}, Param{DType::f16, true}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(dtype_name(info.param.compute)) +
                                  (info.param.channels_last ? "_channels_last" : "_channels_first");
                         });

TEST(Convolution, OutputShapeFollowsTorch) {
  Tensor w({4, 2, 3, 3}, DType::f32, 1), hint({1, 2, 8, 8}, DType::f32, 2);
  const Convolution conv(w.view(), nullptr, {{2, 1}, {1, 0}, {1, 0}, {1, 2}, 1, false}, {}, hint.view());
  // torch: floor((I + 2p - d(k-1) - 1) / s) + 1
  EXPECT_EQ(conv.output_shape({3, 2, 9, 10}), (std::vector<int64_t>{3, 4, 5, 6}));
  // torch's ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1): (I-1)s - 2p + d(k-1) + op + 1
  Tensor wt({2, 4, 3, 3}, DType::f32, 3);
  const Convolution deconv(wt.view(), nullptr, {{2, 2}, {1, 1}, {0, 0}, {1, 1}, 1, true}, {}, hint.view());
  EXPECT_EQ(deconv.output_shape({1, 2, 8, 8}), (std::vector<int64_t>{1, 4, 16, 16}));
  EXPECT_EQ(deconv.in_channels(), 2);
  EXPECT_EQ(deconv.out_channels(), 4);
  EXPECT_THROW(conv.output_shape({1, 2, 1, 1}), ValueError);  // nothing left after a 3x3 kernel dilated by 2
  EXPECT_THROW(conv.output_shape({1, 3, 8, 8}), ValueError);  // channels
  EXPECT_THROW(conv.output_shape({2, 8, 8}), ValueError);     // rank
}

TEST(Convolution, ThreadCountChangesNothingButSpeed) {
  Tensor w({32, 16, 3, 3}, DType::f32, 1), x({2, 16, 12, 12}, DType::f32, 2, true);
  const Convolution conv(w.view(), nullptr, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, false}, {}, x.view());
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, saved}) {
    set_num_threads(threads);
    Tensor out(conv.output_shape(x.sizes), DType::f32, 3, true);
    conv.forward(x.view(), out.view());
    results.push_back(out.f32);
  }
  set_num_threads(saved);
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < results[0].size(); ++i) ASSERT_NEAR(results[r][i], results[0][i], 1e-4);
  }
}

// Several threads calling one layer at once with inputs of one shape share a cached primitive, whose argument set is
// kept between calls (onednn::BoundPrimitive): each call must read and write its own buffers.
TEST(Convolution, ConcurrentCallsOfOnePrimitiveUseTheirOwnBuffers) {
  Tensor w({8, 4, 3, 3}, DType::f32, 1), hint({2, 4, 9, 9}, DType::f32, 2, true);
  std::vector<float> bias(8, 0.5f);
  const TensorView bias_view(bias.data(), DType::f32, {8});
  const Convolution conv(w.view(), &bias_view, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, false}, {}, hint.view());
  const int saved = num_threads();
  set_num_threads(1);  // the concurrency under test is the callers'
  constexpr int kThreads = 4, kCalls = 150;
  std::vector<Tensor> xs;
  std::vector<std::vector<float>> expected;
  for (int t = 0; t < kThreads; ++t) {
    xs.emplace_back(std::vector<int64_t>{2, 4, 9, 9}, DType::f32, 10 + t, true);
    Tensor out(conv.output_shape(xs[t].sizes), DType::f32, 0, true);
    conv.forward(xs[t].view(), out.view(), {PostOp::act(Activation::relu)});
    expected.push_back(out.f32);
  }
  const std::vector<int> mismatches = testing::failures_on_threads(kThreads, kCalls, [&](int t, int call) {
    Tensor out(conv.output_shape(xs[t].sizes), DType::f32, 100 + call, true);
    conv.forward(xs[t].view(), out.view(), {PostOp::act(Activation::relu)});
    return out.f32 == expected[t];
  });
  set_num_threads(saved);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_EQ(conv.cached_primitives(), 1u);
}

// NaN, +inf and -inf in the input and a NaN in the residual (stored in the other layout) through the activations
// oneDNN computes with max/min (Linear.NonFiniteValuesPassThroughEveryActivationAsInTorch says why) and through
// one it keeps NaN in, alone and beside an add: as torch, NaN stays NaN and relu(-inf) is 0.
TEST(Convolution, NonFiniteValuesPassThroughTheActivationsAsInTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Epilogue epilogues[] = {{PostOp::act(Activation::relu)},
                                {PostOp::act(Activation::relu6)},
                                {PostOp::act(Activation::hardsigmoid)},
                                {PostOp::act(Activation::silu)},
                                {PostOp::add(), PostOp::act(Activation::relu)},
                                {PostOp::act(Activation::relu), PostOp::add()}};
  const Case c = geometry_cases()[2];
  for (DType compute : {DType::f32, DType::bf16}) {
    if (!Convolution::supported(compute)) continue;
    for (bool channels_last : {false, true}) {
      Tensor w(c.weight, DType::f32, 1);
      if (compute == DType::bf16) {
        for (float& v : w.f32) v = to_bf16_and_back(v);
      }
      Tensor hint(c.inputs[0], compute, 3, channels_last);
      const Convolution layer(w.view(), nullptr, c.geometry, {compute}, hint.view());
      uint32_t seed = 40;
      for (const Epilogue& epilogue : epilogues) {
        Tensor x(c.inputs[0], compute, seed++, channels_last);
        x.set({0, 0, 1, 1}, nan);
        x.set({0, 1, 4, 4}, inf);
        x.set({0, 2, 2, 5}, -inf);
        const std::vector<int64_t> out_shape = layer.output_shape(c.inputs[0]);
        Tensor out(out_shape, compute, seed++, channels_last);
        Tensor residual(out_shape, DType::f32, seed++, !channels_last);
        residual.set({0, 1, 0, 0}, nan);
        const TensorView rv = residual.view();
        layer.forward(x.view(), out.view(), epilogue, has_operand(epilogue) ? &rv : nullptr);
        std::vector<double> value, scale;
        reference(x, w, nullptr, c.geometry, out_shape, value, scale);
        const double out_rel = compute == DType::bf16 ? 1.0 / 128 : 0.0;
        int64_t flat = 0;
        for_each_index(out_shape, [&](const std::vector<int64_t>& oi) {
          const ChainReference want = reference_chain(epilogue, value[flat], residual.at(oi));
          const double err = scale[flat++];
          const double slack = compute == DType::bf16 ? want.bf16_slack : 0.0;
          const double tol = 1e-5 * (err + 8) + out_rel * std::fabs(want.value) + slack + 1e-6;
          ASSERT_TRUE(testing::matches_reference(out.at(oi), want.value, tol))
              << dtype_name(compute) << (channels_last ? " channels-last" : "") << " epilogue starting "
              << (epilogue[0].kind == PostOp::Kind::add ? "add" : activation_name(epilogue[0].activation))
              << " at flat index " << flat - 1;
        });
      }
    }
  }
}

TEST(Convolution, EmptyBatchWritesNothing) {
  Tensor w({4, 2, 3}, DType::f32, 1), hint({1, 2, 6}, DType::f32, 2), x({0, 2, 6}, DType::f32, 3);
  Tensor out({0, 4, 4}, DType::f32, 4);
  const Convolution conv(w.view(), nullptr, {{1}, {0}, {0}, {1}, 1, false}, {}, hint.view());
  EXPECT_NO_THROW(conv.forward(x.view(), out.view()));
  EXPECT_EQ(conv.cached_primitives(), 0u);  // construction packs the weights and builds no primitive
}

TEST(Convolution, RefusesBadArgumentsWithoutWriting) {
  Tensor w({4, 2, 3, 3}, DType::f32, 1), x({1, 2, 5, 5}, DType::f32, 2), out({1, 4, 3, 3}, DType::f32, 3);
  Tensor residual({1, 4, 3, 3}, DType::f32, 4), wrong_c({1, 3, 5, 5}, DType::f32, 5);
  Tensor wrong_out({1, 4, 4, 4}, DType::f32, 6), out_bf16({1, 4, 3, 3}, DType::bf16, 7),
      xb({1, 2, 5, 5}, DType::bf16, 8);
  const Convolution::Geometry g{{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1, false};
  const Convolution conv(w.view(), nullptr, g, {}, x.view());
  const std::vector<float> before = out.f32;
  const TensorView rv = residual.view();
  EXPECT_THROW(conv.forward(wrong_c.view(), out.view()), ValueError);
  EXPECT_THROW(conv.forward(x.view(), wrong_out.view()), ValueError);
  EXPECT_THROW(conv.forward(xb.view(), out.view()), TypeError);
  EXPECT_THROW(conv.forward(x.view(), out_bf16.view()), TypeError);
  EXPECT_THROW(conv.forward(x.view(), out.view(), {}, &rv), ValueError);
  EXPECT_THROW(conv.forward(x.view(), out.view(), {PostOp::add()}), ValueError);
  // The residual in out's memory but laid out otherwise: it overlaps out (only out itself is added in place).
  const int64_t out_sizes[4] = {1, 4, 3, 3}, transposed_strides[4] = {36, 1, 12, 4};
  const TensorView shuffled(out.view().data(), DType::f32, out_sizes, transposed_strides, 4);
  EXPECT_THROW(conv.forward(x.view(), out.view(), {PostOp::add()}, &shuffled), ValueError);
  EXPECT_THROW(conv.forward(x.view(), out.view(), {PostOp::add(), PostOp::act(Activation::relu)}, &shuffled),
               ValueError);
  EXPECT_EQ(out.f32, before);

  EXPECT_THROW(Convolution(w.view(), nullptr, {{1}, {0}, {0}, {1}, 1, false}, {}, x.view()), ValueError);
  EXPECT_THROW(Convolution(w.view(), nullptr, {{0, 1}, {0, 0}, {0, 0}, {1, 1}, 1, false}, {}, x.view()), ValueError);
  EXPECT_THROW(Convolution(w.view(), nullptr, {{1, 1}, {0, 0}, {-1, 0}, {1, 1}, 1, true}, {}, x.view()), ValueError);
  EXPECT_THROW(Convolution(w.view(), nullptr, {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 3, false}, {}, x.view()), ValueError);
  EXPECT_THROW(Convolution(w.view(), nullptr, g, {DType::f64}, x.view()), TypeError);
  EXPECT_THROW(Convolution(w.view(), nullptr, g, {}, wrong_c.view()), ValueError);
  Tensor short_bias({3}, DType::f32, 9);
  const TensorView bv = short_bias.view();
  EXPECT_THROW(Convolution(w.view(), &bv, g, {}, x.view()), ValueError);
  Tensor flat({4, 2}, DType::f32, 10);
  EXPECT_THROW(Convolution(flat.view(), nullptr, g, {}, x.view()), ValueError);
}

TEST(Convolution, UnsupportedDtypeFailsClearly) {
  if (Convolution::supported(DType::bf16)) GTEST_SKIP() << "this CPU has oneDNN's bf16 convolution";
  Tensor w({4, 2, 3, 3}, DType::f32, 1), x({1, 2, 5, 5}, DType::bf16, 2);
  EXPECT_THROW(Convolution(w.view(), nullptr, {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1, false}, {DType::bf16}, x.view()),
               RuntimeError);
  EXPECT_TRUE(Convolution::supported(DType::f32));
}

// float16 runs only where the CPU has AVX512-FP16; elsewhere construction says so.
TEST(Convolution, Float16NeedsAvx512Fp16) {
  EXPECT_TRUE(cpu_features().avx512_fp16 || !Convolution::supported(DType::f16));
  if (Convolution::supported(DType::f16)) GTEST_SKIP() << "this CPU has oneDNN's native f16 convolution";
  Tensor w({4, 2, 3, 3}, DType::f32, 1), x({1, 2, 5, 5}, DType::f16, 2, true);
  EXPECT_THROW(Convolution(w.view(), nullptr, {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1, false}, {DType::f16}, x.view()),
               RuntimeError);
}

TEST(Convolution, StridesOfSizeOneDimensionsDoNotChooseTheImplementation) {
  // torch 1.13 exports a size-1 batch with stride 1; oneDNN must still see channels-last (not run its reference).
  Tensor w({32, 16, 3, 3}, DType::f32, 1), x({1, 16, 8, 8}, DType::f32, 2, true);
  const Convolution conv(w.view(), nullptr, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, false}, {}, x.view());
  std::vector<int64_t> odd = x.strides;
  odd[0] = 1;
  const TensorView x_odd(x.f32.data(), DType::f32, x.sizes.data(), odd.data(), 4);
  EXPECT_EQ(conv.implementation(x_odd), conv.implementation(x.view()));
  EXPECT_EQ(conv.implementation(x_odd).rfind("ref", 0), std::string::npos) << conv.implementation(x_odd);
  Tensor out(conv.output_shape(x.sizes), DType::f32, 3, true), out_odd(conv.output_shape(x.sizes), DType::f32, 4, true);
  conv.forward(x.view(), out.view());
  std::vector<int64_t> odd_out = out_odd.strides;
  odd_out[0] = 1;
  conv.forward(x_odd, TensorView(out_odd.f32.data(), DType::f32, out_odd.sizes.data(), odd_out.data(), 4));
  EXPECT_EQ(out.f32, out_odd.f32);
  EXPECT_EQ(conv.cached_primitives(), 1u);
}

TEST(Convolution, ReportsItsImplementation) {
  Tensor w({32, 16, 3, 3}, DType::f32, 1), x({1, 16, 8, 8}, DType::f32, 2, true);
  const Convolution conv(w.view(), nullptr, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, false}, {}, x.view());
  EXPECT_FALSE(conv.implementation(x.view()).empty());
  EXPECT_EQ(conv.cached_primitives(), 1u);
}

}  // namespace
}  // namespace ember
