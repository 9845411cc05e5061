// Dispatch of the epilogue: a row at a time to the widest body the ISA cap allows (epilogue_<isa>.cpp).
#include "epilogue/epilogue_rows.h"

#include <algorithm>
#include <array>

#include "ember/bf16.h"
#include "ember/parallel.h"
#include "epilogue/epilogue_kernels.h"

namespace ember::epilogue {
namespace {

using namespace kernels;

constexpr IsaImpl<FinishRowFn> kFinishRow[] = {
    {Isa::avx512, finish_row_avx512}, {Isa::avx2, finish_row_avx2}, {Isa::ref, finish_row_ref}};

// Row i, column j of a [m, N] view with unit stride along N.
char* at(const TensorView& t, int64_t i, int64_t j) {
  return static_cast<char*>(t.data()) + (i * t.stride(0) + j) * static_cast<int64_t>(dtype_size(t.dtype()));
}

// finish_in_place's unit of work: kSpan columns of a line, a multiple of 16 (finish_rows' note) that keeps a bf16
// output's widened copy on the stack.
constexpr int64_t kSpan = 1024;
constexpr int64_t kGrainSpans = 16;  // a parallel chunk: 16k elements, as ember's other elementwise loops

// An N-d view walked as lines: runs of `length` elements at unit stride in both out and residual (one line over
// all of memory when both are dense alike, else the lines of a dimension where both have unit stride, else single
// elements), and the outer dimensions that step from one line to the next.
struct Lines {
  int64_t count = 1;
  int64_t length = 1;
  int outer = 0;
  std::array<int64_t, kMaxDims> sizes{}, out_strides{}, residual_strides{};

  Lines(const TensorView& out, const TensorView* residual) {
    if (out.is_dense() && (residual == nullptr || residual->same_layout(out))) {
      length = out.numel();
      return;
    }
    int along = -1;
    for (int d = 0; d < out.ndim(); ++d) {
      const bool unit = out.stride(d) == 1 && (residual == nullptr || residual->stride(d) == 1);
      if (unit && out.size(d) > 1 && (along < 0 || out.size(d) > out.size(along))) along = d;
    }
    if (along >= 0) length = out.size(along);
    for (int d = 0; d < out.ndim(); ++d) {
      if (d == along || out.size(d) == 1) continue;
      sizes[outer] = out.size(d);
      out_strides[outer] = out.stride(d);
      residual_strides[outer] = residual != nullptr ? residual->stride(d) : 0;
      count *= out.size(d);
      ++outer;
    }
  }

  // Element offsets of line `index` in out and residual (the last outer dimension varies fastest).
  std::pair<int64_t, int64_t> start(int64_t index) const {
    int64_t out_offset = 0, residual_offset = 0;
    for (int d = outer - 1; d >= 0; --d) {
      const int64_t i = index % sizes[d];
      index /= sizes[d];
      out_offset += i * out_strides[d];
      residual_offset += i * residual_strides[d];
    }
    return {out_offset, residual_offset};
  }
};

char* element(const TensorView& t, int64_t offset) {
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

void finish_rows(const float* sums, int64_t ld, int64_t m, int64_t n0, int64_t n1, const float* bias,
                 const Epilogue& epilogue, const TensorView* residual, const TensorView& out) {
  const FinishRowFn finish_row = select_impl(kFinishRow, active_isa()).fn;
  Row row{};
  row.bias = bias != nullptr ? bias + n0 : nullptr;
  row.ops = epilogue.data();
  row.num_ops = static_cast<int64_t>(epilogue.size());
  row.residual_dtype = residual != nullptr ? residual->dtype() : DType::f32;
  row.out_dtype = out.dtype();
  row.n = n1 - n0;
  for (int64_t i = 0; i < m; ++i) {
    row.sums = sums + i * ld;
    row.residual = residual != nullptr ? at(*residual, i, n0) : nullptr;  // read only by an add
    row.out = at(out, i, n0);
    finish_row(row);
  }
}

void finish_in_place(const Epilogue& epilogue, const TensorView* residual, const TensorView& out) {
  if (epilogue.empty() || out.numel() == 0) return;
  const FinishRowFn finish_row = select_impl(kFinishRow, active_isa()).fn;
  const Lines lines(out, residual);
  const int64_t spans_per_line = (lines.length + kSpan - 1) / kSpan;
  const bool widen = out.dtype() == DType::bf16;
  parallel_for(lines.count * spans_per_line, kGrainSpans, 1, [&](int64_t, int64_t begin, int64_t end) {
    alignas(64) std::array<float, kSpan> widened;
    Row row{};
    row.ops = epilogue.data();
    row.num_ops = static_cast<int64_t>(epilogue.size());
    row.residual_dtype = residual != nullptr ? residual->dtype() : DType::f32;
    row.out_dtype = out.dtype();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t line = task / spans_per_line, first = task % spans_per_line * kSpan;
      const auto [out_offset, residual_offset] = lines.start(line);
      row.n = std::min(kSpan, lines.length - first);
      row.out = element(out, out_offset + first);
      row.residual = residual != nullptr ? element(*residual, residual_offset + first) : nullptr;
      if (widen) {
        const auto* stored = static_cast<const uint16_t*>(row.out);
        for (int64_t j = 0; j < row.n; ++j) widened[j] = bf16::widen(stored[j]);
        row.sums = widened.data();
      } else {
        row.sums = static_cast<const float*>(row.out);  // each lane is read before it is written
      }
      finish_row(row);
    }
  });
}

Isa implementation() { return select_impl(kFinishRow, active_isa()).isa; }

}  // namespace ember::epilogue
