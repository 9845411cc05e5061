// Frozen batch norm: argument checks, the per-channel scale and shift, and the parallel pass over x's memory in the
// layout it has. The arithmetic lives in channel_affine_body.inl.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/errors.h"
#include "ember/norm.h"
#include "ember/parallel.h"
#include "norm_kernels.h"

namespace ember::norm {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "frozen_batch_norm";

template <typename X, typename Y>
constexpr IsaImpl<AffineFn<X, Y>> kChannelRows[3] = {
    {Isa::avx512, channel_rows_avx512<X, Y>}, {Isa::avx2, channel_rows_avx2<X, Y>}, {Isa::ref, channel_rows_ref<X, Y>}};
template <typename X, typename Y>
constexpr IsaImpl<AffineFn<X, Y>> kPositionRows[3] = {{Isa::avx512, position_rows_avx512<X, Y>},
                                                      {Isa::avx2, position_rows_avx2<X, Y>},
                                                      {Isa::ref, position_rows_ref<X, Y>}};

// The body for storages X, Y at `isa` (row-major or channels-last): float64 takes its one path
// (channel_affine_f64.cpp) on every machine, the others their ISA's.
template <typename X, typename Y>
AffineFn<X, Y> affine_fn(bool channels_last, Isa isa) {
  if constexpr (std::is_same_v<X, double>) {
    return channels_last ? position_rows_f64 : channel_rows_f64;
  } else {
    return select_impl(channels_last ? kPositionRows<X, Y> : kChannelRows<X, Y>, isa).fn;
  }
}

// Work worth a fork/join (about 30 us of streaming), and the least a chunk then holds: the rows spread over every
// thread of the team (ember::row_grain).
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 11;

// How x's memory splits into rows: C-long rows of positions (channels-last) or `inner`-long rows of one channel.
struct Layout {
  bool channels_last = false;
  int64_t channels = 0, inner = 0, rows = 0;
};

Layout check_layout(std::string_view name, const TensorView& x) {
  EMBER_CHECK(x.ndim() >= 2, ValueError, kOp, ": ", name, " must be at least 2-D ([N, C, ...]), got ", x.describe());
  EMBER_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f64, TypeError, kOp, ": ",
              name, " must have dtype float32, bfloat16 or float64, got ", dtype_name(x.dtype()));
  Layout l;
  l.channels = x.size(1);
  if (x.is_contiguous()) {
    l.inner = l.channels == 0 || x.size(0) == 0 ? 0 : x.numel() / (x.size(0) * l.channels);
    l.rows = x.size(0) * l.channels;
    return l;
  }
  EMBER_CHECK(x.is_dense() && (x.stride(1) == 1 || l.channels == 1), ValueError, kOp, ": ", name,
              " must be contiguous or channels-last (channels innermost, no gaps), got a ", x.describe(),
              " view with other strides");
  l.channels_last = true;
  l.inner = 1;
  l.rows = l.channels == 0 ? 0 : x.numel() / l.channels;
  return l;
}

void check_channel_vector(std::string_view name, const TensorView& v, int64_t channels, DType dtype) {
  check::dtype(kOp, name, v, dtype);
  check::contiguous(kOp, name, v);
  EMBER_CHECK(v.ndim() == 1 && v.size(0) == channels, ValueError, kOp, ": ", name, " must be [", channels,
              "] (one value a channel), got ", v.describe());
}

void check_output(std::string_view name, const TensorView& out, std::string_view in_name, const TensorView& in) {
  if (in.dtype() == DType::f64) {
    check::dtype(kOp, name, out, DType::f64);
  } else {
    EMBER_CHECK(out.dtype() == DType::f32 || out.dtype() == in.dtype(), TypeError, kOp, ": ", name,
                " must have dtype float32 or ", dtype_name(in.dtype()), ", got ", dtype_name(out.dtype()));
  }
  check::same_shape(kOp, name, out, in_name, in);
  EMBER_CHECK(out.same_layout(in), ValueError, kOp, ": ", name, " must have the strides of ", in_name);
  const bool in_place = out.data() == in.data() && out.dtype() == in.dtype();
  if (!in_place) check::no_overlap(kOp, name, out, in_name, in);
}

// scale[c] = weight[c] * rsqrt(var[c] + eps), in R (float32, or float64) in torchvision's order.
template <typename R>
std::vector<R> scales(const TensorView& weight, const TensorView& var, double eps) {
  const auto n = static_cast<size_t>(weight.numel());
  std::vector<R> scale(n);
  const auto e = static_cast<R>(eps);
  for (size_t c = 0; c < n; ++c)
    scale[c] = weight.data_as<const R>()[c] * (R{1} / std::sqrt(var.data_as<const R>()[c] + e));
  return scale;
}

template <typename X, typename Y>
void run_typed(const TensorView& x, const TensorView& y, const Layout& l, const Arithmetic<X>* scale,
               const Arithmetic<X>* shift, bool relu) {
  AffineArgs<X, Y> a{x.data_as<const X>(), y.data_as<Y>(), scale, shift, l.channels, l.inner, relu};
  const AffineFn<X, Y> fn = affine_fn<X, Y>(l.channels_last, active_isa());
  const int64_t row_size = l.channels_last ? l.channels : l.inner;
  const int64_t grain = row_grain(l.rows, row_size, kParallelElements, kChunkElements);
  parallel_for(l.rows, grain, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

// y = x * scale + shift (shift null: none) in R, the arithmetic type of x's dtype, for the checked dtypes of x and y.
template <typename R>
void run(const TensorView& x, const TensorView& y, const Layout& l, const R* scale, const R* shift, bool relu = false) {
  if constexpr (std::is_same_v<R, double>) {
    run_typed<double, double>(x, y, l, scale, shift, false);
  } else if (x.dtype() != DType::bf16) {
    run_typed<float, float>(x, y, l, scale, shift, relu);
  } else if (y.dtype() == DType::bf16) {
    run_typed<uint16_t, uint16_t>(x, y, l, scale, shift, relu);
  } else {
    run_typed<uint16_t, float>(x, y, l, scale, shift, relu);
  }
}

template <typename R>
void forward_typed(const TensorView& x, const TensorView& weight, const TensorView& bias,
                   const TensorView& running_mean, const TensorView& running_var, double eps, const TensorView& out,
                   const Layout& l, bool relu) {
  const std::vector<R> scale = scales<R>(weight, running_var, eps);
  std::vector<R> shift(scale.size());
  for (size_t c = 0; c < shift.size(); ++c) {
    shift[c] = bias.data_as<const R>()[c] - running_mean.data_as<const R>()[c] * scale[c];
  }
  run(x, out, l, scale.data(), shift.data(), relu);
}

}  // namespace

Isa implementation() { return select_impl(kChannelRows<float, float>, active_isa()).isa; }

void frozen_batch_norm(const TensorView& x, const TensorView& weight, const TensorView& bias,
                       const TensorView& running_mean, const TensorView& running_var, double eps, const TensorView& out,
                       bool relu) {
  const Layout l = check_layout("x", x);
  const DType acc = arithmetic_dtype(x.dtype());
  EMBER_CHECK(!relu || acc != DType::f64, ValueError, kOp, ": relu is for float32 and bfloat16 x, got ",
              dtype_name(x.dtype()));
  check_channel_vector("weight", weight, l.channels, acc);
  check_channel_vector("bias", bias, l.channels, acc);
  check_channel_vector("running_mean", running_mean, l.channels, acc);
  check_channel_vector("running_var", running_var, l.channels, acc);
  EMBER_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError, kOp, ": eps must be a finite number >= 0, got ", eps);
  check_output("out", out, "x", x);
  for (const TensorView* v : {&weight, &bias, &running_mean, &running_var}) {
    check::no_overlap(kOp, "out", out, "a buffer", *v);
  }
  if (acc == DType::f64) {
    forward_typed<double>(x, weight, bias, running_mean, running_var, eps, out, l, false);
  } else {
    forward_typed<float>(x, weight, bias, running_mean, running_var, eps, out, l, relu);
  }
}

void frozen_batch_norm_backward(const TensorView& grad_y, const TensorView& weight, const TensorView& running_var,
                                double eps, const TensorView& grad_x) {
  const Layout l = check_layout("grad_y", grad_y);
  const DType acc = arithmetic_dtype(grad_y.dtype());
  check_channel_vector("weight", weight, l.channels, acc);
  check_channel_vector("running_var", running_var, l.channels, acc);
  EMBER_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError, kOp, ": eps must be a finite number >= 0, got ", eps);
  check_output("grad_x", grad_x, "grad_y", grad_y);
  if (acc == DType::f64) {
    run(grad_y, grad_x, l, scales<double>(weight, running_var, eps).data(), static_cast<const double*>(nullptr));
  } else {
    run(grad_y, grad_x, l, scales<float>(weight, running_var, eps).data(), static_cast<const float*>(nullptr));
  }
}

}  // namespace ember::norm
