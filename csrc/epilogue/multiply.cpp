// ember::multiply: the epilogue's multiply post-op applied on its own (epilogue::finish_from), x read where it lies in
// float32, or, in bfloat16, copied into out first and multiplied there in place (finish_from reads a bf16 source only
// in place).
#include <string_view>

#include "ember/copy.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "epilogue/epilogue_rows.h"

namespace ember {

void multiply(const TensorView& x, const TensorView& factor, const TensorView& out) {
  constexpr std::string_view op = "multiply";
  EMBER_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, TypeError, op,
              ": x must be float32 or bfloat16, got ", dtype_name(x.dtype()));
  check::dtype(op, "factor", factor, x.dtype());
  check::dtype(op, "out", out, x.dtype());
  check::same_shape(op, "factor", factor, "x", x);
  check::same_shape(op, "out", out, "x", x);
  EMBER_CHECK(x.byte_extent() >= 0 && factor.byte_extent() >= 0, ValueError, op,
              ": x and factor must have no negative strides");
  EMBER_CHECK(out.is_dense(), ValueError, op, ": out must be dense (any order of dimensions), got a ", out.describe(),
              " view with gaps or overlaps");
  check::no_overlap(op, "out", out, "x", x);
  check::no_overlap(op, "out", out, "factor", factor);
  if (out.numel() == 0) return;
  const Epilogue product = {PostOp::multiply()};
  if (x.dtype() == DType::f32) {
    epilogue::finish_from(product, x, &factor, out);
    return;
  }
  copy(x, out);
  epilogue::finish_from(product, out, &factor, out);
}

}  // namespace ember
