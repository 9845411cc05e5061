// Row normalisations (LayerNorm, RMSNorm) with the residual add before them: argument checks, the operands as
// rows, and the parallel pass over the rows. The arithmetic lives in row_norm_body.inl.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "ember/errors.h"
#include "ember/norm.h"
#include "ember/parallel.h"
#include "ember/trace.h"
#include "norm_kernels.h"

namespace ember::norm {
namespace {

using namespace kernels;

constexpr IsaImpl<RowNormFn> kRowNorm[3] = {
    {Isa::avx512, row_norm_avx512}, {Isa::avx2, row_norm_avx2}, {Isa::ref, row_norm_ref}};

// Work worth a fork/join (about 30 us of streaming), and the least a chunk then holds: the rows spread over every
// thread of the team (ember::row_grain).
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 11;

std::string_view op_name(RowNorm kind) { return kind == RowNorm::rms ? "rms_norm" : "layer_norm"; }

// t as [rows, cols] rows (a 1-D tensor is one row), or a ValueError naming it.
TensorView as_rows(std::string_view op, std::string_view name, const TensorView& t) {
  EMBER_CHECK(is_f32_or_bf16(t.dtype()), TypeError, op, ": ", name, " must have dtype float32 or bfloat16, got ",
              dtype_name(t.dtype()));
  EMBER_CHECK(t.ndim() >= 1, ValueError, op, ": ", name, " must be at least 1-D, got ", t.describe());
  std::optional<TensorView> rows;
  if (t.ndim() == 1) {
    const int64_t sizes[2] = {1, t.size(0)}, strides[2] = {t.size(0), t.stride(0)};
    rows.emplace(t.data(), t.dtype(), sizes, strides, 2);
  } else {
    rows = t.as_matrix();
  }
  EMBER_CHECK(rows.has_value() && (rows->size(1) <= 1 || rows->stride(1) == 1), ValueError, op, ": ", name,
              " must be a [..., features] tensor with features of stride 1 and leading dimensions that flatten into "
              "rows without a copy, got ",
              t.describe(), " of other strides");
  return *rows;
}

// An output's rows must not write over each other: distinct rows at least a row apart (or one row at most).
void check_writable_rows(std::string_view op, std::string_view name, const TensorView& rows) {
  EMBER_CHECK(rows.size(0) <= 1 || rows.stride(0) >= rows.size(1), ValueError, op, ": ", name,
              " must hold its rows apart (a broadcast or overlapping view cannot be written), got a row stride of ",
              rows.stride(0), " for rows of ", rows.size(1));
}

void check_param(std::string_view op, std::string_view name, const TensorView& p, int64_t cols, DType dtype) {
  check::dtype(op, name, p, dtype);
  check::contiguous(op, name, p);
  EMBER_CHECK(p.numel() == cols && p.ndim() >= 1, ValueError, op, ": ", name, " must hold one value a feature (", cols,
              "), got ", p.describe());
}

// An output that is one of the inputs (same memory, dtype and strides: in place) or shares no memory with it.
void check_input_output(std::string_view op, std::string_view out_name, const TensorView& out, std::string_view in_name,
                        const TensorView& in) {
  const bool in_place = out.data() == in.data() && out.dtype() == in.dtype() && out.same_layout(in);
  if (!in_place) check::no_overlap(op, out_name, out, in_name, in);
}

template <typename P>
Rows<P> rows_of(const TensorView& rows) {
  return Rows<P>{rows.data(), rows.size(0) <= 1 ? 0 : rows.stride(0), rows.dtype() == DType::bf16};
}

}  // namespace

void row_norm(RowNorm kind, const TensorView& x, const TensorView* residual, const TensorView* weight,
              const TensorView* bias, double eps, const TensorView& out, const TensorView* sum_out,
              const TensorView* out_bf16) {
  const std::string_view op = op_name(kind);
  const TensorView x_rows = as_rows(op, "x", x);
  const int64_t rows = x_rows.size(0), cols = x_rows.size(1);
  std::optional<TensorView> residual_rows, sum_rows;
  if (residual != nullptr) {
    check::same_shape(op, "residual", *residual, "x", x);
    residual_rows = as_rows(op, "residual", *residual);
  }
  const DType h_dtype =
      x.dtype() == DType::bf16 && (residual == nullptr || residual->dtype() == DType::bf16) ? DType::bf16 : DType::f32;
  if (weight != nullptr && bias != nullptr) {
    EMBER_CHECK(weight->dtype() == bias->dtype(), TypeError, op, ": weight and bias must have one dtype, got ",
                dtype_name(weight->dtype()), " and ", dtype_name(bias->dtype()));
  }
  const DType param_dtype = weight != nullptr ? weight->dtype() : bias != nullptr ? bias->dtype() : DType::f32;
  EMBER_CHECK(is_f32_or_bf16(param_dtype), TypeError, op, ": weight and bias must have dtype float32 or bfloat16, got ",
              dtype_name(param_dtype));
  if (weight != nullptr) check_param(op, "weight", *weight, cols, param_dtype);
  if (bias != nullptr) {
    EMBER_CHECK(kind == RowNorm::layer, ValueError, op, ": RMSNorm takes no bias");
    check_param(op, "bias", *bias, cols, param_dtype);
  }
  EMBER_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError, op, ": eps must be a finite number >= 0, got ", eps);

  check::same_shape(op, "out", out, "x", x);
  const TensorView out_rows = as_rows(op, "out", out);
  check_writable_rows(op, "out", out_rows);
  if (sum_out != nullptr) {
    EMBER_CHECK(residual != nullptr, ValueError, op, ": sum_out is the sum x + residual, and no residual was given");
    check::same_shape(op, "sum_out", *sum_out, "x", x);
    EMBER_CHECK(sum_out->dtype() == h_dtype, TypeError, op, ": sum_out must have the dtype of x + residual (",
                dtype_name(h_dtype), "), got ", dtype_name(sum_out->dtype()));
    sum_rows = as_rows(op, "sum_out", *sum_out);
    check_writable_rows(op, "sum_out", *sum_rows);
    check::no_overlap(op, "out", out, "sum_out", *sum_out);
  }
  std::optional<TensorView> low_rows;
  if (out_bf16 != nullptr) {
    EMBER_CHECK(out.dtype() == DType::f32, TypeError, op, ": out_bf16 is out rounded to bfloat16, for a float32 out; ",
                "out is ", dtype_name(out.dtype()));
    check::dtype(op, "out_bf16", *out_bf16, DType::bf16);
    check::same_shape(op, "out_bf16", *out_bf16, "x", x);
    low_rows = as_rows(op, "out_bf16", *out_bf16);
    check_writable_rows(op, "out_bf16", *low_rows);
    check::no_overlap(op, "out_bf16", *out_bf16, "out", out);
    if (sum_out != nullptr) check::no_overlap(op, "out_bf16", *out_bf16, "sum_out", *sum_out);
  }
  for (const auto& [name, output] :
       {std::pair{"out", &out}, std::pair{"sum_out", sum_out}, std::pair{"out_bf16", out_bf16}}) {
    if (output == nullptr) continue;
    check_input_output(op, name, *output, "x", x);
    if (residual != nullptr) check_input_output(op, name, *output, "residual", *residual);
    if (weight != nullptr) check::no_overlap(op, name, *output, "weight", *weight);
    if (bias != nullptr) check::no_overlap(op, name, *output, "bias", *bias);
  }
  if (rows == 0 || cols == 0) return;

  RowNormArgs a;
  a.rms = kind == RowNorm::rms;
  a.eps = static_cast<float>(eps);
  a.cols = cols;
  a.x = rows_of<const void>(x_rows);
  if (residual_rows) a.residual = rows_of<const void>(*residual_rows);
  a.sum.bf16 = h_dtype == DType::bf16;
  if (sum_rows) a.sum = rows_of<void>(*sum_rows);
  a.weight = weight != nullptr ? weight->data() : nullptr;
  a.bias = bias != nullptr ? bias->data() : nullptr;
  a.params_bf16 = param_dtype == DType::bf16;
  a.out = rows_of<void>(out_rows);
  if (low_rows) a.out_bf16 = rows_of<void>(*low_rows);
  const auto& impl = select_impl(kRowNorm, active_isa());
  const KernelTrace trace(op, impl.isa, [&] {
    return "rows=" + std::to_string(rows) + ",cols=" + std::to_string(cols) + (residual_rows ? ",residual" : "") + "," +
           std::string(dtype_name(x.dtype()));
  });
  const RowNormFn fn = impl.fn;
  const int64_t grain = row_grain(rows, cols, kParallelElements, kChunkElements);
  parallel_for(rows, grain, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

}  // namespace ember::norm
