// Dispatch of the epilogue: a row at a time to the widest body the ISA cap allows (epilogue_kernels.cpp, compiled once
// per ISA).
#include "epilogue/epilogue_rows.h"

#include <algorithm>
#include <array>

#include "ember/parallel.h"
#include "epilogue/epilogue_kernels.h"

namespace ember::epilogue {
namespace {

using namespace kernels;

// The avx512_bf16 body differs only in its bf16 stores (vcvtneps2bf16: simd_avx512.inl).
constexpr IsaImpl<FinishRowFn> kFinishRow[] = {{Isa::avx512_bf16, finish_row_avx512_bf16},
                                               {Isa::avx512, finish_row_avx512},
                                               {Isa::avx2, finish_row_avx2},
                                               {Isa::ref, finish_row_ref}};

// Row i, column j of a [m, N] view with unit stride along N.
char* at(const TensorView& t, int64_t i, int64_t j) {
  return static_cast<char*>(t.data()) + (i * t.stride(0) + j) * static_cast<int64_t>(dtype_size(t.dtype()));
}

// finish_from's unit of work: kSpan columns of a line, a multiple of 16 (finish_rows' note).
constexpr int64_t kSpan = 1024;
// A parallel chunk: 4k elements, a quarter of ember's other elementwise loops. The pass reads what the primitive's
// threads just wrote, in their partition, not this one: most lines come from other cores' caches, and more threads
// fetch more of them at once. On the 16-core Xeon a bf16 ReLU over a ResNet-50 1x1 convolution's output at batch 1
// took 6.4-9.9 us at 4k against 11.8-17.5 us at 16k (1k gained nothing more).
constexpr int64_t kGrainSpans = 4;

// finish_from's views walked together as lines: runs of `length` elements at unit stride in every view (one line
// over all of memory when all are dense alike, else the lines of a dimension where all have unit stride, else
// single elements), and the outer dimensions that step from one line to the next.
class Lines {
 public:
  static constexpr int kViews = 3;  // out, source, residual

  Lines(const TensorView& out, const TensorView& source, const TensorView* residual) {
    const TensorView* views[kViews] = {&out, &source, residual != nullptr ? residual : &out};
    bool alike = out.is_dense();
    for (const TensorView* v : views) alike = alike && v->same_layout(out);
    if (alike) {
      length_ = out.numel();
      return;
    }
    int along = -1;
    for (int d = 0; d < out.ndim(); ++d) {
      bool unit = out.size(d) > 1;
      for (const TensorView* v : views) unit = unit && v->stride(d) == 1;
      if (unit && (along < 0 || out.size(d) > out.size(along))) along = d;
    }
    if (along >= 0) length_ = out.size(along);
    for (int d = 0; d < out.ndim(); ++d) {
      if (d == along || out.size(d) == 1) continue;
      sizes_[outer_] = out.size(d);
      for (int v = 0; v < kViews; ++v) strides_[v][outer_] = views[v]->stride(d);
      count_ *= out.size(d);
      ++outer_;
    }
  }

  int64_t count() const noexcept { return count_; }
  int64_t length() const noexcept { return length_; }

  // Element offsets of line `index` in each view (the last outer dimension varies fastest).
  std::array<int64_t, kViews> start(int64_t index) const noexcept {
    std::array<int64_t, kViews> offsets{};
    for (int d = outer_ - 1; d >= 0; --d) {
      const int64_t i = index % sizes_[d];
      index /= sizes_[d];
      for (int v = 0; v < kViews; ++v) offsets[v] += i * strides_[v][d];
    }
    return offsets;
  }

 private:
  int64_t count_ = 1;
  int64_t length_ = 1;
  int outer_ = 0;
  std::array<int64_t, kMaxDims> sizes_{};
  std::array<std::array<int64_t, kMaxDims>, kViews> strides_{};
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
  row.sums_dtype = DType::f32;
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

void finish_from(const Epilogue& epilogue, const TensorView& source, const TensorView* residual,
                 const TensorView& out) {
  if (out.numel() == 0) return;
  const FinishRowFn finish_row = select_impl(kFinishRow, active_isa()).fn;
  const Lines lines(out, source, residual);
  const int64_t spans_per_line = (lines.length() + kSpan - 1) / kSpan;
  parallel_for(lines.count() * spans_per_line, kGrainSpans, 1, [&](int64_t, int64_t begin, int64_t end) {
    Row row{};
    row.sums_dtype = source.dtype();
    row.ops = epilogue.data();
    row.num_ops = static_cast<int64_t>(epilogue.size());
    row.residual_dtype = residual != nullptr ? residual->dtype() : DType::f32;
    row.out_dtype = out.dtype();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t line = task / spans_per_line, first = task % spans_per_line * kSpan;
      const auto [out_at, source_at, residual_at] = lines.start(line);
      row.n = std::min(kSpan, lines.length() - first);
      row.sums = element(source, source_at + first);  // may be row.out: each block is read before it is written
      row.out = element(out, out_at + first);
      row.residual = residual != nullptr ? element(*residual, residual_at + first) : nullptr;
      finish_row(row);
    }
  });
}

Isa implementation() { return select_impl(kFinishRow, active_isa()).isa; }

}  // namespace ember::epilogue
