// Dispatch, parallel split and argument checks of dropout. The kernels are dropout_kernels.cpp, compiled once per ISA.
#include <algorithm>
#include <cmath>
#include <string>

#include "dropout_kernels.h"
#include "ember/dropout.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/trace.h"

namespace ember::dropout {
namespace {

using namespace kernels;

template <typename S>
constexpr IsaImpl<ApplyFn<S>> kApply[] = {
    {Isa::avx512, apply_avx512<S>}, {Isa::avx2, apply_avx2<S>}, {Isa::ref, apply_ref<S>}};

// Philox costs about 1.5 vector instructions per element, so a thread pays for its fork/join sooner than in
// the memory-bound kernels: 16K elements (~30 us on one core) a chunk.
constexpr int64_t kGrain = 1 << 14;
// Chunks start on tile boundaries (64 elements): the body computes whole tiles' generator blocks.
constexpr int64_t kAlign = 64;

template <typename S>
void run(const S* x, S* y, int64_t n, const Params& params, const char* dtype) {
  const auto& impl = select_impl(kApply<S>, active_isa());
  const KernelTrace trace("dropout", impl.isa, [&] { return std::string(dtype) + ",n=" + std::to_string(n); });
  parallel_for(n, kGrain, kAlign, [&](int64_t, int64_t begin, int64_t end) {
    impl.fn(x, y, begin, end, params.seed, params.threshold, params.scale);
  });
}

}  // namespace

Params make_params(double p, uint64_t seed) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got ", p);
  Params params;
  params.seed = seed;
  if (p == 1.0) {
    params.threshold = 0;  // every word passes, and is multiplied by 0
    params.scale = 0.0f;
  } else {
    // p within 2^-33 of 1 would round to 2^32, which drops everything: keep one word in 2^32 instead.
    params.threshold = static_cast<uint32_t>(std::min(std::nearbyint(std::ldexp(p, 32)), 4294967295.0));
    params.scale = static_cast<float>(1.0 / (1.0 - p));
  }
  return params;
}

Isa implementation() { return select_impl(kApply<float>, active_isa()).isa; }

void apply(const float* x, float* y, int64_t n, const Params& params) { run(x, y, n, params, "float32"); }

void apply_bf16(const uint16_t* x, uint16_t* y, int64_t n, const Params& params) { run(x, y, n, params, "bfloat16"); }

void apply(const TensorView& x, const TensorView& out, double p, uint64_t seed) {
  constexpr std::string_view op = "dropout";
  EMBER_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, TypeError, op,
              ": x must have dtype float32 or bfloat16, got ", dtype_name(x.dtype()));
  check::dtype(op, "out", out, x.dtype());
  check::same_shape(op, "out", out, "x", x);
  EMBER_CHECK(x.is_dense(), ValueError, op, ": x must be dense (each element once, no gaps), got a ", x.describe(),
              " view with other strides");
  EMBER_CHECK(out.same_layout(x), ValueError, op, ": out must have the strides of x");
  if (out.data() != x.data()) check::no_overlap(op, "out", out, "x", x);
  const Params params = make_params(p, seed);
  if (x.dtype() == DType::f32) {
    apply(x.data_as<const float>(), out.data_as<float>(), x.numel(), params);
  } else {
    apply_bf16(x.data_as<const uint16_t>(), out.data_as<uint16_t>(), x.numel(), params);
  }
}

}  // namespace ember::dropout
