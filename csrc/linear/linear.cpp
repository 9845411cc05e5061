// ember::Linear: checks a call's arguments, asks the router (linear_route.h) which kernel serves it, and runs it.
#include "ember/linear.h"

#include <string>

#include "ember/errors.h"
#include "ember/isa.h"
#include "ember/trace.h"
#include "linear/linear_onednn.h"
#include "linear/linear_route.h"
#include "onednn/onednn_common.h"
#include "skinny/skinny_matmul.h"
#include "tile_matmul/tile_matmul.h"

namespace ember {

const char* kernel_name(LinearKernel kernel) noexcept {
  switch (kernel) {
    case LinearKernel::caller: return "caller";
    case LinearKernel::skinny: return "skinny";
    case LinearKernel::tiles: return "tiles";
    case LinearKernel::few_rows: return "few_rows";
    case LinearKernel::swapped: return "swapped";
    case LinearKernel::onednn: return "onednn";
  }
  return "unknown";
}

struct Linear::Impl {
  int64_t n = 0, k = 0;
  Options options;
  std::vector<float> bias;  // empty: no bias; declared before onednn, which keeps a reference to it
  std::unique_ptr<linear::OnednnMatmul> onednn;

  void check(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
             const TensorView* residual) const;
  void run(LinearKernel kernel, const TensorView& x, const TensorView* weight, const TensorView& out,
           const Epilogue& epilogue, const TensorView* residual) const;
  // The packed copy is one the tile matmul reads (the router's packed_for_tiles).
  bool packed_for_tiles() const noexcept { return onednn->tile_weights().data != nullptr; }
};

Linear::Linear(const TensorView& weight, const TensorView* bias, Options options) : impl_(std::make_unique<Impl>()) {
  EMBER_CHECK(weight.ndim() == 2 && weight.size(0) >= 1 && weight.size(1) >= 1, ValueError,
              "Linear: weight must be a non-empty [out_features, in_features] matrix, got ", weight.describe());
  EMBER_CHECK(weight.dtype() == DType::f32 || weight.dtype() == DType::bf16, TypeError,
              "Linear: weight must be float32 or bfloat16, got ", dtype_name(weight.dtype()));
  EMBER_CHECK(onednn::is_compute_dtype(options.compute), TypeError,
              "Linear: compute dtype must be float32, bfloat16 or float16, got ", dtype_name(options.compute));
  EMBER_CHECK(options.prepack || weight.dtype() == options.compute, TypeError,
              "Linear: without prepacking the weight must be in the compute dtype ", dtype_name(options.compute),
              ", got ", dtype_name(weight.dtype()));
  EMBER_CHECK(options.rows_hint >= 1, ValueError, "Linear: rows_hint must be >= 1, got ", options.rows_hint);
  EMBER_CHECK(supported(options.compute), RuntimeError, "Linear: oneDNN has no ", dtype_name(options.compute),
              " matmul on this CPU (bfloat16 needs AVX-512, float16 AVX512-FP16); Linear::supported() says so ",
              "before construction");
  impl_->n = weight.size(0);
  impl_->k = weight.size(1);
  impl_->options = options;
  if (bias != nullptr) impl_->bias = onednn::bias_to_f32("Linear", *bias, impl_->n);
  impl_->onednn = std::make_unique<linear::OnednnMatmul>(weight, impl_->bias, options);
}

Linear::~Linear() = default;

int64_t Linear::out_features() const noexcept { return impl_->n; }
int64_t Linear::in_features() const noexcept { return impl_->k; }
const Linear::Options& Linear::options() const noexcept { return impl_->options; }
size_t Linear::packed_bytes() const { return impl_->onednn->packed_bytes(); }
size_t Linear::cached_primitives() const { return impl_->onednn->cached_primitives(); }

void Linear::Impl::check(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
                         const TensorView* residual) const {
  const DType compute = options.compute;
  EMBER_CHECK(x.ndim() == 2 && x.size(1) == k, ValueError, "Linear: x must have shape [M, ", k, "], got ",
              x.describe());
  check::dtype("Linear", "x", x, compute);
  EMBER_CHECK(x.stride(1) == 1 || k == 1, ValueError, "Linear: x must have unit stride along in_features, got ",
              "strides [", x.stride(0), ", ", x.stride(1), "]");
  // oneDNN and the skinny matmul read rows at x.stride(0): an expanded (zero-stride) or overlapping view would be
  // read as other numbers than it holds (values near 1e33 were returned).
  EMBER_CHECK(x.size(0) <= 1 || x.stride(0) >= k, ValueError, "Linear: the rows of x must not overlap (row stride ",
              x.stride(0), " < in_features ", k, "); pass a contiguous copy of an expanded tensor");
  EMBER_CHECK(weight != nullptr || options.prepack, ValueError,
              "Linear: weight must be given to a layer that is not prepacked");
  if (weight != nullptr) {
    EMBER_CHECK(weight->ndim() == 2 && weight->size(0) == n && weight->size(1) == k, ValueError,
                "Linear: weight must have shape [", n, ", ", k, "], got ", weight->describe());
    EMBER_CHECK(weight->dtype() == DType::f32 || weight->dtype() == DType::bf16, TypeError,
                "Linear: weight must be float32 or bfloat16, got ", dtype_name(weight->dtype()));
    EMBER_CHECK(options.prepack || weight->dtype() == compute, TypeError,
                "Linear: without prepacking the weight must be in the compute dtype ", dtype_name(compute), ", got ",
                dtype_name(weight->dtype()));
  }
  EMBER_CHECK(out.ndim() == 2 && out.size(0) == x.size(0) && out.size(1) == n, ValueError,
              "Linear: out must have shape [", x.size(0), ", ", n, "], got ", out.describe());
  onednn::check_output("Linear", compute, x, out, epilogue, residual);
  if (weight != nullptr) check::no_overlap("Linear", "out", out, "weight", *weight);
  EMBER_CHECK(out.stride(1) == 1 || n == 1, ValueError, "Linear: out must have unit stride along out_features");
  EMBER_CHECK(out.size(0) <= 1 || out.stride(0) >= n, ValueError, "Linear: the rows of out must not overlap (row ",
              "stride ", out.stride(0), " < out_features ", n, ")");
  EMBER_CHECK(residual == nullptr || residual->stride(1) == 1 || n == 1, ValueError,
              "Linear: residual must have unit stride along out_features");
  EMBER_CHECK(residual == nullptr || residual->size(0) <= 1 || residual->stride(0) >= n, ValueError,
              "Linear: the rows of residual must not overlap (row stride < out_features ", n,
              "); pass a contiguous copy of an expanded tensor");
}

int64_t Linear::skinny_rows(DType compute) noexcept { return skinny::max_rows(compute); }

namespace {

std::string matmul_implementation(DType compute) {
  const dnnl::memory::desc a({64, 64}, onednn::to_dnnl(compute), dnnl::memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(onednn::engine(), a, a, a);
  return pd.impl_info_str();
}

}  // namespace

bool Linear::supported(DType compute) {
  static const bool bf16 = onednn::compute_supported(DType::bf16, matmul_implementation);
  static const bool f16 = onednn::compute_supported(DType::f16, matmul_implementation);
  return compute == DType::f32 || (compute == DType::bf16 && bf16) || (compute == DType::f16 && f16);
}

LinearKernel Linear::route(DType compute, int64_t rows, const TensorView& weight, bool in_place, bool caller_mkl_fp32) {
  EMBER_CHECK(onednn::is_compute_dtype(compute), TypeError,
              "Linear.route: compute dtype must be float32, bfloat16 or float16, got ", dtype_name(compute));
  EMBER_CHECK(rows >= 1, ValueError, "Linear.route: rows must be >= 1, got ", rows);
  EMBER_CHECK(weight.ndim() == 2 && weight.size(0) >= 1 && weight.size(1) >= 1, ValueError,
              "Linear.route: weight must be a non-empty [out_features, in_features] matrix, got ", weight.describe());
  EMBER_CHECK(!in_place || weight.dtype() == compute, TypeError, "Linear.route: a weight read in place must be in ",
              "the compute dtype ", dtype_name(compute), ", got ", dtype_name(weight.dtype()));
  if (linear::caller_is_faster(compute, rows, weight, in_place, caller_mkl_fp32)) return LinearKernel::caller;
  // Shapes only: these views are never read or written.
  const TensorView x(nullptr, compute, {rows, weight.size(1)});
  const TensorView out(nullptr, compute, {rows, weight.size(0)});
  // A packed bf16 copy is taken to be in the layout oneDNN packs for AMX, which the tile matmul reads; a layer whose
  // copy is not (Linear::forward knows) runs such calls on oneDNN.
  return linear::route_call(compute, x, in_place ? &weight : nullptr, out, {}, nullptr, /*packed_for_tiles=*/true);
}

void Linear::forward(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
                     const TensorView* residual) const {
  impl_->check(x, weight, out, epilogue, residual);
  if (x.size(0) == 0) return;
  const TensorView* in_place = impl_->options.prepack ? nullptr : weight;
  const bool tiles = impl_->packed_for_tiles();
  impl_->run(linear::route_call(impl_->options.compute, x, in_place, out, epilogue, residual, tiles), x, weight, out,
             epilogue, residual);
}

void Linear::forward_on(LinearKernel kernel, const TensorView& x, const TensorView* weight, const TensorView& out,
                        const Epilogue& epilogue, const TensorView* residual) const {
  EMBER_CHECK(kernel == LinearKernel::onednn || kernel == LinearKernel::tiles || kernel == LinearKernel::few_rows,
              ValueError, "Linear.forward: the kernel to run must be 'onednn', 'tiles' or 'few_rows', got '",
              kernel_name(kernel), "'");
  const bool packed_reader = kernel == LinearKernel::tiles || kernel == LinearKernel::few_rows;
  EMBER_CHECK(!packed_reader || impl_->packed_for_tiles(), ValueError, "Linear.forward: the ", kernel_name(kernel),
              " kernel reads a packed bfloat16 copy in oneDNN's AMX layout, and this layer has none (",
              dtype_name(impl_->options.compute), impl_->options.prepack ? ", prepacked" : ", in place", ")");
  EMBER_CHECK(kernel != LinearKernel::tiles || tile_matmul::available(impl_->options.compute), RuntimeError,
              "Linear.forward: the tile matmul needs AMX, and the ISA cap or this CPU leaves it off (ISA ",
              isa_name(active_isa()), ")");
  EMBER_CHECK(kernel != LinearKernel::few_rows || tile_matmul::few_rows_available(impl_->options.compute), RuntimeError,
              "Linear.forward: the few-row matmul needs AVX512-BF16, and the ISA cap or this CPU leaves ",
              "it off (ISA ", isa_name(active_isa()), ")");
  impl_->check(x, weight, out, epilogue, residual);
  EMBER_CHECK(kernel != LinearKernel::tiles || x.size(0) <= tile_matmul::kMaxCallRows, ValueError,
              "Linear.forward: the tile matmul takes at most ", tile_matmul::kMaxCallRows, " rows, got ", x.size(0));
  EMBER_CHECK(kernel != LinearKernel::few_rows || x.size(0) <= tile_matmul::kMaxFewRows, ValueError,
              "Linear.forward: the few-row matmul takes at most ", tile_matmul::kMaxFewRows, " rows, got ", x.size(0));
  if (x.size(0) == 0) return;
  impl_->run(kernel, x, weight, out, epilogue, residual);
}

void Linear::Impl::run(LinearKernel kernel, const TensorView& x, const TensorView* weight, const TensorView& out,
                       const Epilogue& epilogue, const TensorView* residual) const {
  if (kernel == LinearKernel::tiles || kernel == LinearKernel::few_rows || kernel == LinearKernel::skinny) {
    const KernelTrace trace("linear", kernel_name(kernel), [&] {
      // These kernels run the whole epilogue on their tiles.
      const std::string fused = epilogue.empty() ? "" : ",fused=" + epilogue_name(epilogue);
      return "m=" + std::to_string(x.size(0)) + ",n=" + std::to_string(n) + ",k=" + std::to_string(k) + "," +
             std::string(dtype_name(options.compute)) + ",out=" + std::string(dtype_name(out.dtype())) + fused;
    });
    if (kernel == LinearKernel::tiles) {
      const auto& tiles = onednn->tile_weights();
      tile_matmul::matmul(x, tiles.data, tiles.layout, bias, out, epilogue, residual);
    } else if (kernel == LinearKernel::few_rows) {
      const auto& tiles = onednn->tile_weights();
      tile_matmul::few_rows_matmul(x, tiles.data, tiles.layout, bias, out, epilogue, residual);
    } else {
      skinny::matmul(x, *weight, bias, out, epilogue, residual);
    }
    return;
  }
  onednn->run(kernel == LinearKernel::swapped, x, weight, out, epilogue, residual);
}

std::string Linear::implementation(int64_t m, const TensorView* weight) const {
  EMBER_CHECK(m >= 1, ValueError, "Linear.implementation: m must be >= 1, got ", m);
  EMBER_CHECK(weight != nullptr || impl_->options.prepack, ValueError,
              "Linear.implementation: weight must be given to a layer that is not prepacked");
  // Shapes only: these views are never read or written.
  const TensorView x(nullptr, impl_->options.compute, {m, impl_->k});
  const TensorView out(nullptr, impl_->options.compute, {m, impl_->n});
  const TensorView* in_place = impl_->options.prepack ? nullptr : weight;
  const LinearKernel kernel =
      linear::route_call(impl_->options.compute, x, in_place, out, {}, nullptr, impl_->packed_for_tiles());
  if (kernel == LinearKernel::skinny) {
    return "ember:skinny:" + std::string(isa_name(skinny::implementation(weight->dtype(), m, impl_->k)));
  }
  if (kernel == LinearKernel::tiles) return "ember:tiles:amx";
  if (kernel == LinearKernel::few_rows) return "ember:few_rows:avx512_bf16";
  return impl_->onednn->implementation(kernel == LinearKernel::swapped, x, weight, out);
}

}  // namespace ember
