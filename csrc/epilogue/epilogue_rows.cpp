// Dispatch of the epilogue: a row at a time to the widest body the ISA cap allows (epilogue_<isa>.cpp).
#include "epilogue/epilogue_rows.h"

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

Isa implementation() { return select_impl(kFinishRow, active_isa()).isa; }

}  // namespace ember::epilogue
