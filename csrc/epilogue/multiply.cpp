// ember::multiply: the epilogue's multiply post-op applied on its own (epilogue::finish_from), x read where it lies
// when it is float32 or laid out as out; a bfloat16 x in another layout is copied into out first (ember::copy walks
// out in its memory order) and multiplied there in place, where reading it across the layouts would walk single
// elements. A squeeze-excitation's product is then one pass over its operand where the copy made it two (Zen 5, bf16
// [16, 672, 14, 14] channels-last: 106 us, where the copy alone took 44).
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
  if (x.dtype() == DType::f32 || x.same_layout(out)) {
    epilogue::finish_from(product, x, &factor, out);
    return;
  }
  copy(x, out);
  epilogue::finish_from(product, out, &factor, out);
}

}  // namespace ember
