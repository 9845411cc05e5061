// Max and average pooling: every ISA path and dtype against a double-precision reference of ember/pool.h over
// window geometries (padding, dilation, ceil mode, uneven kernels, a global window), channel counts off the vector
// width, padded rows; for the max NaN and infinities in the input, with and without the ReLU; for the average every
// divisor rule; torch's output sizes; results independent of the thread count (a global pool at batch 1 spreads its
// channels); argument checks that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/pool.h"
#include "isa_test_util.h"
#include "random_matrix.h"

namespace ember {
namespace {

using testing::Matrix;

// A channels-last [N, C, H, W] activation held as an (N·H·W) x C matrix whose rows may be padded (a pixel stride
// larger than C).
struct Image {
  int64_t n, c, h, w;
  Matrix pixels;
  Image(int64_t n_, int64_t c_, int64_t h_, int64_t w_, DType dtype, uint32_t seed, int64_t pad = 0)
      : n(n_), c(c_), h(h_), w(w_), pixels(n_ * h_ * w_, c_, dtype, seed, pad) {}
  double at(int64_t ni, int64_t ci, int64_t hi, int64_t wi) const { return pixels.at((ni * h + hi) * w + wi, ci); }
  void set(int64_t ni, int64_t ci, int64_t hi, int64_t wi, float v) { pixels.set((ni * h + hi) * w + wi, ci, v); }
  TensorView view() {
    const TensorView m = pixels.view();
    const int64_t ld = pixels.ld, sizes[4] = {n, c, h, w}, strides[4] = {h * w * ld, 1, w * ld, ld};
    return TensorView(m.data(), m.dtype(), sizes, strides, 4);
  }
};

pool::Window2d window(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1,
                      int64_t dw = 1, bool ceil_mode = false) {
  pool::Window2d win;
  win.kernel[0] = kh, win.kernel[1] = kw, win.stride[0] = sh, win.stride[1] = sw;
  win.padding[0] = ph, win.padding[1] = pw, win.dilation[0] = dh, win.dilation[1] = dw;
  win.ceil_mode = ceil_mode;
  return win;
}

// torch's definition: the window's largest element, NaN if it holds one, -inf for padding; then max(., 0).
double reference(const Image& x, const pool::Window2d& win, bool relu, int64_t ni, int64_t ci, int64_t oh, int64_t ow) {
  double best = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < win.kernel[0]; ++i) {
    for (int64_t j = 0; j < win.kernel[1]; ++j) {
      const int64_t hi = oh * win.stride[0] - win.padding[0] + i * win.dilation[0];
      const int64_t wi = ow * win.stride[1] - win.padding[1] + j * win.dilation[1];
      if (hi < 0 || hi >= x.h || wi < 0 || wi >= x.w) continue;
      const double v = x.at(ni, ci, hi, wi);
      if (std::isnan(v) || v > best) best = v;
      if (std::isnan(best)) return best;
    }
  }
  return relu && best < 0 ? 0.0 : best;
}

// Sprinkles NaN and infinities over a few pixels of every channel block.
void add_specials(Image& x) {
  const float specials[3] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
  for (int64_t k = 0; k < 3 * x.c; k += 7) {
    const int64_t flat = (k * 104729) % (x.n * x.h * x.w);
    x.set(flat / (x.h * x.w), k % x.c, (flat / x.w) % x.h, flat % x.w, specials[k % 3]);
  }
}

void run_case(const pool::Window2d& win, int64_t c, DType dtype, bool relu, bool specials, Isa isa) {
  Image x(2, c, 11, 9, dtype, 1, c % 3);
  if (specials) add_specials(x);
  const int64_t oh =
      pool::output_size(11, win.kernel[0], win.stride[0], win.padding[0], win.dilation[0], win.ceil_mode);
  const int64_t ow = pool::output_size(9, win.kernel[1], win.stride[1], win.padding[1], win.dilation[1], win.ceil_mode);
  Image out(2, c, oh, ow, dtype, 2);
  pool::max_pool2d(x.view(), win, relu, out.view());
  for (int64_t ni = 0; ni < 2; ++ni) {
    for (int64_t hi = 0; hi < oh; ++hi) {
      for (int64_t wi = 0; wi < ow; ++wi) {
        for (int64_t ci = 0; ci < c; ++ci) {
          const double want = reference(x, win, relu, ni, ci, hi, wi), got = out.at(ni, ci, hi, wi);
          ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
              << "isa " << isa_name(isa) << " " << dtype_name(dtype) << " c " << c << " kernel " << win.kernel[0] << "x"
              << win.kernel[1] << " relu " << relu << " at (" << ni << ", " << ci << ", " << hi << ", " << wi
              << "): " << got << " want " << want;
        }
      }
    }
  }
}

TEST(MaxPool, EveryDtypeAndGeometryMatchesTheDefinitionOnEveryPath) {
  const pool::Window2d windows[] = {
      window(3, 3, 2, 2, 1, 1),              // ResNet's stem
      window(2, 2, 2, 2, 0, 0),              // VGG's
      window(3, 3, 1, 1, 1, 1, 2, 2),        // dilated, stride 1
      window(3, 3, 2, 2, 0, 0, 1, 1, true),  // ceil mode (GoogLeNet's)
      window(2, 2, 2, 2, 1, 1, 1, 1, true),  // ceil mode dropping a window that starts in the right padding
      window(3, 2, 1, 2, 1, 0, 1, 3),        // uneven kernel, stride and dilation
      window(11, 9, 1, 1, 0, 0),             // the whole image (a global max)
  };
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    ASSERT_EQ(pool::implementation(), std::min(isa, Isa::avx512));
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const pool::Window2d& win : windows) {
        for (int64_t c : {1, 5, 16, 17, 67, 128}) {
          for (bool relu : {false, true}) run_case(win, c, dtype, relu, c != 16, isa);
        }
      }
      run_case(window(11, 9, 1, 1, 0, 0), 2100, dtype, true, true, isa);  // a pixel's sums in two runs of channels
    }
  }
}

// torch's average: the taps inside the input summed, divided by the window clipped to the padded input (or to the
// input without count_include_pad, or by the fixed divisor).
double average_reference(const Image& x, const pool::Window2d& win, bool include_pad, int64_t divisor, int64_t ni,
                         int64_t ci, int64_t oh, int64_t ow) {
  const int64_t h0 = oh * win.stride[0] - win.padding[0], w0 = ow * win.stride[1] - win.padding[1];
  double sum = 0;
  int64_t inside = 0;
  for (int64_t hi = std::max<int64_t>(h0, 0); hi < std::min(h0 + win.kernel[0], x.h); ++hi) {
    for (int64_t wi = std::max<int64_t>(w0, 0); wi < std::min(w0 + win.kernel[1], x.w); ++wi) {
      sum += x.at(ni, ci, hi, wi);
      ++inside;
    }
  }
  const int64_t padded = (std::min(h0 + win.kernel[0], x.h + win.padding[0]) - h0) *
                         (std::min(w0 + win.kernel[1], x.w + win.padding[1]) - w0);
  return sum / static_cast<double>(divisor != 0 ? divisor : include_pad ? padded : inside);
}

void run_average_case(const pool::Window2d& win, int64_t c, DType dtype, bool include_pad, int64_t divisor, Isa isa) {
  Image x(2, c, 11, 9, dtype, 1, c % 3);
  const int64_t oh = pool::output_size(11, win.kernel[0], win.stride[0], win.padding[0], 1, win.ceil_mode);
  const int64_t ow = pool::output_size(9, win.kernel[1], win.stride[1], win.padding[1], 1, win.ceil_mode);
  Image out(2, c, oh, ow, dtype, 2);
  pool::avg_pool2d(x.view(), win, include_pad, divisor, out.view());
  // float32 sums of up to 99 taps, then one rounding to the output's dtype.
  const double tolerance = dtype == DType::bf16 ? 1.0 / 256 : 1e-5;
  for (int64_t ni = 0; ni < 2; ++ni) {
    for (int64_t hi = 0; hi < oh; ++hi) {
      for (int64_t wi = 0; wi < ow; ++wi) {
        for (int64_t ci = 0; ci < c; ++ci) {
          const double want = average_reference(x, win, include_pad, divisor, ni, ci, hi, wi);
          ASSERT_NEAR(out.at(ni, ci, hi, wi), want, tolerance * (1 + std::abs(want)))
              << "isa " << isa_name(isa) << " " << dtype_name(dtype) << " c " << c << " kernel " << win.kernel[0] << "x"
              << win.kernel[1] << " include_pad " << include_pad << " divisor " << divisor << " at (" << ni << ", "
              << ci << ", " << hi << ", " << wi << ")";
        }
      }
    }
  }
}

TEST(AvgPool, EveryDtypeAndDivisorRuleMatchesTheDefinitionOnEveryPath) {
  const pool::Window2d windows[] = {
      window(3, 3, 2, 2, 1, 1),              // a padded, strided window
      window(2, 2, 2, 2, 0, 0),              // DenseNet's transition
      window(3, 3, 1, 1, 1, 1),              // Inception's branch pool
      window(3, 3, 2, 2, 0, 0, 1, 1, true),  // ceil mode: the last window clipped by the input
      window(2, 2, 2, 2, 1, 1, 1, 1, true),  // ceil mode: clipped by the padded input
      window(3, 2, 1, 2, 1, 0),              // uneven kernel and stride
      window(11, 9, 11, 9, 0, 0),            // the whole image (a global average)
  };
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const pool::Window2d& win : windows) {
        for (int64_t c : {1, 5, 17, 67, 128}) {
          for (bool include_pad : {true, false}) run_average_case(win, c, dtype, include_pad, 0, isa);
          run_average_case(win, c, dtype, true, 5, isa);
        }
      }
      run_average_case(window(11, 9, 11, 9, 0, 0), 2100, dtype, true, 0, isa);
    }
  }
}

TEST(AvgPool, AGlobalPoolAtBatchOneDoesNotDependOnTheThreadCount) {
  const int saved = num_threads();
  Image x(1, 1000, 7, 7, DType::f32, 1);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3, 8, 16}) {
    set_num_threads(threads);
    Image out(1, 1000, 1, 1, DType::f32, 2);
    pool::avg_pool2d(x.view(), window(7, 7, 7, 7, 0, 0), true, 0, out.view());
    results.push_back(out.pixels.f32);
  }
  set_num_threads(saved);
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[0], results[i]);
}

TEST(AvgPool, BadArgumentsThrowAndWriteNothing) {
  Image x(1, 8, 6, 6, DType::f32, 1), out(1, 8, 3, 3, DType::f32, 2);
  const std::vector<float> before = out.pixels.f32;
  EXPECT_THROW(pool::avg_pool2d(x.view(), window(2, 2, 2, 2, 0, 0, 2, 1), true, 0, out.view()), ValueError);
  EXPECT_THROW(pool::avg_pool2d(x.view(), window(2, 2, 2, 2, 0, 0), true, -1, out.view()), ValueError);
  EXPECT_THROW(pool::avg_pool2d(x.view(), window(2, 2, 2, 2, 2, 0), true, 0, out.view()), ValueError);
  EXPECT_EQ(out.pixels.f32, before);
}

TEST(MaxPool, OutputSizesAreTorchs) {
  EXPECT_EQ(pool::output_size(112, 3, 2, 1, 1, false), 56);  // ResNet-50's stem
  EXPECT_EQ(pool::output_size(112, 3, 2, 1, 1, true), 57);   // the 57th starts in the last row
  EXPECT_EQ(pool::output_size(5, 3, 2, 0, 1, false), 2);
  EXPECT_EQ(pool::output_size(6, 3, 2, 0, 1, false), 2);
  EXPECT_EQ(pool::output_size(6, 3, 2, 0, 1, true), 3);
  EXPECT_EQ(pool::output_size(5, 2, 2, 1, 1, true), 3);  // a 4th window would start in the right padding
  EXPECT_EQ(pool::output_size(7, 3, 1, 1, 2, false), 5);
  EXPECT_EQ(pool::output_size(1, 1, 1, 0, 1, false), 1);
  EXPECT_THROW(pool::output_size(2, 3, 1, 0, 1, false), ValueError);  // no whole window
  EXPECT_THROW(pool::output_size(8, 3, 1, 2, 1, false), ValueError);  // padding past half the kernel
  EXPECT_THROW(pool::output_size(8, 3, 0, 1, 1, false), ValueError);
  EXPECT_THROW(pool::output_size(8, 0, 1, 0, 1, false), ValueError);
  EXPECT_THROW(pool::output_size(8, 3, 1, 1, 0, false), ValueError);
  EXPECT_THROW(pool::output_size(8, 3, 1, -1, 1, false), ValueError);
  EXPECT_THROW(pool::output_size(0, 1, 1, 0, 1, false), ValueError);
}

TEST(MaxPool, ResultsDoNotDependOnTheThreadCount) {
  const int saved = num_threads();
  Image x(3, 64, 56, 56, DType::bf16, 1);
  std::vector<std::vector<uint16_t>> results;
  for (int threads : {1, 3, 8}) {
    set_num_threads(threads);
    Image out(3, 64, 28, 28, DType::bf16, 2);
    pool::max_pool2d(x.view(), window(3, 3, 2, 2, 1, 1), true, out.view());
    results.push_back(out.pixels.bf16);
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(MaxPool, BadArgumentsThrowAndWriteNothing) {
  Image x(1, 8, 6, 6, DType::f32, 1), out(1, 8, 3, 3, DType::f32, 2), wrong(1, 8, 4, 3, DType::f32, 2);
  Image out_bf16(1, 8, 3, 3, DType::bf16, 2);
  const std::vector<float> before = out.pixels.f32;
  const pool::Window2d win = window(2, 2, 2, 2, 0, 0);
  const TensorView xv = x.view(), ov = out.view();
  const int64_t sizes[4] = {1, 8, 6, 6}, row_major[4] = {288, 36, 6, 1};
  const TensorView x_row_major(x.pixels.f32.data(), DType::f32, sizes, row_major, 4);
  const TensorView x_int(x.pixels.f32.data(), DType::i32, sizes, xv.strides(), 4);
  const TensorView three_d(x.pixels.f32.data(), DType::f32, {8, 6, 6});
  const int64_t out_sizes[4] = {1, 8, 3, 3}, broadcast[4] = {0, 1, 0, 8};
  const TensorView out_broadcast(out.pixels.f32.data(), DType::f32, out_sizes, broadcast, 4);
  const TensorView out_over_x(x.pixels.f32.data(), DType::f32, out_sizes, ov.strides(), 4);

  EXPECT_THROW(pool::max_pool2d(x_row_major, win, false, ov), ValueError);
  EXPECT_THROW(pool::max_pool2d(x_int, win, false, ov), TypeError);
  EXPECT_THROW(pool::max_pool2d(three_d, win, false, ov), ValueError);
  EXPECT_THROW(pool::max_pool2d(xv, win, false, wrong.view()), ValueError);
  EXPECT_THROW(pool::max_pool2d(xv, win, false, out_bf16.view()), TypeError);
  EXPECT_THROW(pool::max_pool2d(xv, win, false, out_broadcast), ValueError);
  EXPECT_THROW(pool::max_pool2d(xv, win, false, out_over_x), ValueError);
  EXPECT_THROW(pool::max_pool2d(xv, window(2, 2, 2, 2, 2, 0), false, ov), ValueError);
  EXPECT_THROW(pool::max_pool2d(xv, window(2, 2, 0, 2, 0, 0), false, ov), ValueError);
  EXPECT_EQ(out.pixels.f32, before);
}

}  // namespace
}  // namespace ember
