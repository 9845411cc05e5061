// The rotate-half rotary embedding: argument checks, the operands as row strides, and the parallel pass over the
// rows. The arithmetic lives in rope_body.inl.
#include <algorithm>
#include <string>
#include <string_view>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/rope.h"
#include "ember/trace.h"
#include "rope_kernels.h"

namespace ember::rope {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "rotary_embedding";

constexpr IsaImpl<RopeFn> kRope[3] = {
    {Isa::avx512, rotate_half_avx512}, {Isa::avx2, rotate_half_avx2}, {Isa::ref, rotate_half_ref}};

// Work worth a fork/join (about 30 us of streaming), and the least a chunk then holds: the rows spread over every
// thread of the team (ember::row_grain).
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 11;

// A cos or sin table as strides over x's [B, H, L, D], its dimensions aligned from the right.
Rows4<const void> table_rows(std::string_view name, const TensorView& t, const TensorView& x, int64_t rotary) {
  EMBER_CHECK(is_f32_or_bf16(t.dtype()), TypeError, kOp, ": ", name, " must have dtype float32 or bfloat16, got ",
              dtype_name(t.dtype()));
  EMBER_CHECK(t.ndim() >= 1 && t.ndim() <= 4, ValueError, kOp, ": ", name, " must have 1 to 4 dimensions, got ",
              t.describe());
  int64_t strides[4] = {0, 0, 0, 0};
  const int skip = 4 - t.ndim();
  for (int d = 0; d < t.ndim(); ++d) {
    const int64_t size = t.size(d), target = skip + d == 3 ? rotary : x.size(skip + d);
    EMBER_CHECK(size == target || (size == 1 && skip + d < 3), ValueError, kOp, ": ", name, " ", t.describe(),
                " does not broadcast to x ", x.describe(), " (its last dimension must be the rotated features)");
    strides[skip + d] = size == 1 ? 0 : t.stride(d);
  }
  EMBER_CHECK(t.size(t.ndim() - 1) <= 1 || t.stride(t.ndim() - 1) == 1, ValueError, kOp, ": ", name,
              " must have its last dimension of stride 1, got ", t.describe());
  return Rows4<const void>{t.data(), strides[0], strides[1], strides[2], t.dtype() == DType::bf16};
}

}  // namespace

Isa implementation() { return select_impl(kRope, active_isa()).isa; }

void rotate_half(const TensorView& x, const TensorView& cos, const TensorView& sin, const TensorView& out) {
  EMBER_CHECK(is_f32_or_bf16(x.dtype()), TypeError, kOp, ": x must have dtype float32 or bfloat16, got ",
              dtype_name(x.dtype()));
  EMBER_CHECK(x.ndim() == 4, ValueError, kOp, ": x must be 4-D [batch, heads, length, features], got ", x.describe());
  const int64_t dim = x.size(3);
  EMBER_CHECK(dim % 2 == 0, ValueError, kOp, ": x's features must be even (rotated in halves), got ", x.describe());
  EMBER_CHECK(dim <= 1 || x.stride(3) == 1, ValueError, kOp, ": x must have its last dimension of stride 1, got ",
              x.describe());
  EMBER_CHECK(cos.dtype() == sin.dtype(), TypeError, kOp, ": cos and sin must share one dtype, got ",
              dtype_name(cos.dtype()), " and ", dtype_name(sin.dtype()));
  RopeArgs a;
  EMBER_CHECK(cos.ndim() >= 1 && sin.ndim() >= 1, ValueError, kOp, ": cos and sin must have at least one dimension");
  const int64_t rotary = cos.size(cos.ndim() - 1);
  EMBER_CHECK(sin.size(sin.ndim() - 1) == rotary && rotary % 2 == 0 && rotary >= 2 && rotary <= dim, ValueError, kOp,
              ": cos and sin must have one even last dimension (the features rotated) of 2 to x's ", dim, ", got ",
              cos.describe(), " and ", sin.describe());
  a.cos = table_rows("cos", cos, x, rotary);
  a.sin = table_rows("sin", sin, x, rotary);
  a.rotary = rotary;
  EMBER_CHECK(is_f32_or_bf16(out.dtype()), TypeError, kOp, ": out must have dtype float32 or bfloat16, got ",
              dtype_name(out.dtype()));
  check::same_shape(kOp, "out", out, "x", x);
  EMBER_CHECK(out.is_dense() && (dim <= 1 || out.stride(3) == 1), ValueError, kOp,
              ": out must hold each element once with its last dimension of stride 1, got ", out.describe());
  check::no_overlap(kOp, "out", out, "x", x);
  check::no_overlap(kOp, "out", out, "cos", cos);
  check::no_overlap(kOp, "out", out, "sin", sin);
  if (out.numel() == 0) return;

  a.heads = x.size(1);
  a.length = x.size(2);
  a.dim = dim;
  // Rows in the order they lie in memory: one head after another of each token when heads are the inner dimension.
  a.heads_inner = x.size(1) > 1 && x.size(2) > 1 && x.stride(1) < x.stride(2);
  a.x = Rows4<const void>{x.data(), x.stride(0), x.stride(1), x.stride(2), x.dtype() == DType::bf16};
  a.out = Rows4<void>{out.data(), out.stride(0), out.stride(1), out.stride(2), out.dtype() == DType::bf16};
  const int64_t rows = x.size(0) * x.size(1) * x.size(2);
  const auto& impl = select_impl(kRope, active_isa());
  const KernelTrace trace("rotate_half", impl.isa, [&] {
    return "b=" + std::to_string(x.size(0)) + ",h=" + std::to_string(a.heads) + ",l=" + std::to_string(a.length) +
           ",d=" + std::to_string(dim) + (rotary < dim ? ",rotary=" + std::to_string(rotary) : std::string()) + "," +
           std::string(dtype_name(x.dtype()));
  });
  const RopeFn fn = impl.fn;
  const int64_t grain = row_grain(rows, dim, kParallelElements, kChunkElements);
  parallel_for(rows, grain, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

}  // namespace ember::rope
