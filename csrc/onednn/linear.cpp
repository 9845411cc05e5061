// ember::Linear on oneDNN's matmul. torch's weight W is [N, K] row-major, which is the matmul's B = Wᵀ [K, N] with
// strides {1, K}: the reorder into the primitive's layout reads it as that, so no transpose is ever materialized.
// A few rows on a weight in place go to the skinny matmul (skinny/), and fp32 calls of some more rows run the
// matmul transposed (linear_swapped.h).
#include "ember/linear.h"

#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/trace.h"
#include "onednn/linear_swapped.h"
#include "onednn/onednn_common.h"
#include "skinny/skinny_matmul.h"

namespace ember {
namespace {

using dnnl::memory;
using onednn::engine;

constexpr size_t kCachedPrimitives = 128;  // distinct (M, strides, dtypes, threads): sequence lengths, batches

// Everything a primitive depends on besides the layer itself.
using Key = std::array<int64_t, 11>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept { return onednn::hash_ints(k.data(), k.size()); }
};

struct Entry {
  dnnl::matmul::primitive_desc pd;
  std::shared_ptr<const onednn::BoundPrimitive> prim;
  memory packed_weights;  // empty: the call runs on the caller's weight as it is
  bool swapped = false;   // pd computes outᵀ = W xᵀ (onednn/linear_swapped.h)
};

std::shared_ptr<const onednn::BoundPrimitive> bind(const dnnl::matmul::primitive_desc& pd) {
  return std::make_shared<const onednn::BoundPrimitive>(dnnl::matmul(pd), pd);
}

// The caller's [N, K] weight as the matmul's B [K, N].
memory::desc weight_as_b(const TensorView& w) {
  return memory::desc({w.size(1), w.size(0)}, onednn::to_dnnl(w.dtype()), {w.stride(1), w.stride(0)});
}

}  // namespace

struct Linear::Impl {
  int64_t n = 0, k = 0;
  Options options;
  std::vector<float> bias;  // empty: no bias
  mutable std::mutex mutex;
  mutable onednn::LruCache<Key, Entry, KeyHash> cache{kCachedPrimitives};
  mutable onednn::PackedWeights packed;

  void check(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
             const TensorView* residual) const;
  Entry entry_for(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
                  const TensorView* residual, int threads) const;
  Entry make_entry(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
                   const TensorView* residual) const;
  dnnl::matmul::primitive_desc make_pd(const memory::desc& x, const memory::desc& w, const memory::desc& out,
                                       const Epilogue& epilogue, const memory::desc& residual) const;
};

Linear::Linear(const TensorView& weight, const TensorView* bias, Options options) : impl_(std::make_unique<Impl>()) {
  EMBER_CHECK(weight.ndim() == 2 && weight.size(0) >= 1 && weight.size(1) >= 1, ValueError,
              "Linear: weight must be a non-empty [out_features, in_features] matrix, got ", weight.describe());
  EMBER_CHECK(weight.dtype() == DType::f32 || weight.dtype() == DType::bf16, TypeError,
              "Linear: weight must be float32 or bfloat16, got ", dtype_name(weight.dtype()));
  EMBER_CHECK(options.compute == DType::f32 || options.compute == DType::bf16, TypeError,
              "Linear: compute dtype must be float32 or bfloat16, got ", dtype_name(options.compute));
  EMBER_CHECK(options.prepack || weight.dtype() == options.compute, TypeError,
              "Linear: without prepacking the weight must be in the compute dtype ", dtype_name(options.compute),
              ", got ", dtype_name(weight.dtype()));
  EMBER_CHECK(options.rows_hint >= 1, ValueError, "Linear: rows_hint must be >= 1, got ", options.rows_hint);
  EMBER_CHECK(supported(options.compute), RuntimeError, "Linear: oneDNN has no ", dtype_name(options.compute),
              " matmul on this CPU (it needs AVX-512); Linear::supported() says so before construction");
  impl_->n = weight.size(0);
  impl_->k = weight.size(1);
  impl_->options = options;
  if (bias != nullptr) impl_->bias = onednn::bias_to_f32("Linear", *bias, impl_->n);
  if (options.prepack) {
    // Shapes only: these views are never read or written.
    const TensorView x(nullptr, options.compute, {options.rows_hint, impl_->k});
    const TensorView out(nullptr, options.compute, {options.rows_hint, impl_->n});
    // Only the weight is packed: primitives are built by the calls that use them (each with its epilogue), so
    // none is JIT-compiled here for nothing.
    const memory::desc any({impl_->k, impl_->n}, onednn::to_dnnl(options.compute), memory::format_tag::any);
    onednn::use_thread_budget();
    std::lock_guard<std::mutex> lock(impl_->mutex);
    const dnnl::matmul::primitive_desc pd = impl_->make_pd(onednn::md_of(x), any, onednn::md_of(out), {}, {});
    impl_->packed.pack(memory(weight_as_b(weight), engine(), weight.data()), pd.weights_desc());
  }
}

Linear::~Linear() = default;

int64_t Linear::out_features() const noexcept { return impl_->n; }
int64_t Linear::in_features() const noexcept { return impl_->k; }
const Linear::Options& Linear::options() const noexcept { return impl_->options; }

size_t Linear::packed_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->packed.bytes();
}

size_t Linear::cached_primitives() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cache.size();
}

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

dnnl::matmul::primitive_desc Linear::Impl::make_pd(const memory::desc& x, const memory::desc& w,
                                                   const memory::desc& out, const Epilogue& epilogue,
                                                   const memory::desc& residual) const {
  const dnnl::primitive_attr attr = onednn::make_attr(epilogue, residual);
  try {
    if (bias.empty()) return dnnl::matmul::primitive_desc(engine(), x, w, out, attr);
    const memory::desc bias_md({1, n}, memory::data_type::f32, memory::format_tag::ab);
    return dnnl::matmul::primitive_desc(engine(), x, w, bias_md, out, attr);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    throw RuntimeError(detail::concat("Linear: oneDNN has no ", dtype_name(options.compute),
                                      " matmul for this CPU and these arguments (Linear::supported() says whether "
                                      "the dtype is available)"));
  }
}

int64_t Linear::skinny_rows(DType compute) noexcept { return skinny::max_rows(compute); }

bool Linear::supported(DType compute) {
  if (compute != DType::f32 && compute != DType::bf16) return false;
  static const bool bf16 = [] {
    const memory::desc a({2, 2}, memory::data_type::bf16, memory::format_tag::ab);
    try {
      dnnl::matmul::primitive_desc pd(engine(), a, a, a);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return compute == DType::f32 || bf16;
}

Entry Linear::Impl::make_entry(const TensorView& x, const TensorView* weight, const TensorView& out,
                               const Epilogue& epilogue, const TensorView* residual) const {
  const memory::desc x_md = onednn::md_of(x);
  const memory::desc out_md = onednn::md_of(out);
  const memory::desc res_md = residual ? onednn::md_of(*residual) : memory::desc();
  Entry entry;
  if (!options.prepack && onednn::swapped::takes(options.compute, x, *weight, out, epilogue, residual)) {
    try {
      entry.pd = onednn::swapped::make_pd(x, *weight, !bias.empty());
      // oneDNN's reference code would be slower than the plain path's copy of the weight.
      if (std::string_view(entry.pd.impl_info_str()).substr(0, 3) != "ref") {
        entry.prim = bind(entry.pd);
        entry.swapped = true;
        return entry;
      }
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
    }
  }
  if (!options.prepack) {
    entry.pd = make_pd(x_md, weight_as_b(*weight), out_md, epilogue, res_md);
    entry.prim = bind(entry.pd);
    return entry;
  }
  const memory::desc any({k, n}, onednn::to_dnnl(options.compute), memory::format_tag::any);
  entry.pd = make_pd(x_md, any, out_md, epilogue, res_md);
  std::optional<memory> source;
  if (weight != nullptr) source.emplace(weight_as_b(*weight), engine(), weight->data());
  entry.packed_weights = packed.select(
      entry.pd, [&](const memory::desc& layout) { return make_pd(x_md, layout, out_md, epilogue, res_md); },
      source ? &*source : nullptr);
  entry.prim = bind(entry.pd);
  return entry;
}

Entry Linear::Impl::entry_for(const TensorView& x, const TensorView* weight, const TensorView& out,
                              const Epilogue& epilogue, const TensorView* residual, int threads) const {
  const Key key{x.size(0),
                x.stride(0),
                out.stride(0),
                static_cast<int64_t>(out.dtype()),
                residual ? residual->stride(0) : -1,
                residual ? static_cast<int64_t>(residual->dtype()) : -1,
                threads,
                onednn::epilogue_code(epilogue),
                options.prepack ? -1 : static_cast<int64_t>(weight->dtype()),
                options.prepack ? -1 : weight->stride(0),
                options.prepack ? -1 : weight->stride(1)};
  std::lock_guard<std::mutex> lock(mutex);
  if (Entry* hit = cache.find(key)) return *hit;
  return cache.insert(key, make_entry(x, weight, out, epilogue, residual));
}

void Linear::forward(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
                     const TensorView* residual) const {
  impl_->check(x, weight, out, epilogue, residual);
  if (x.size(0) == 0) return;
  const auto sizes = [&] {
    return "m=" + std::to_string(x.size(0)) + ",n=" + std::to_string(impl_->n) + ",k=" + std::to_string(impl_->k) +
           "," + std::string(dtype_name(impl_->options.compute));
  };
  if (weight != nullptr && !impl_->options.prepack && skinny::takes(x, *weight)) {
    const KernelTrace trace("linear", "skinny", sizes);
    skinny::matmul(x, *weight, impl_->bias, out, epilogue, residual);
    return;
  }
  const int threads = onednn::use_thread_budget();
  const onednn::EpilogueSplit split(epilogue, residual, out);
  const Epilogue& post_ops = split.post_ops();
  const TensorView* post_ops_residual = split.post_ops_residual();
  const Entry entry = impl_->entry_for(x, weight, out, post_ops, post_ops_residual, threads);
  const KernelTrace trace(
      "linear", [&] { return entry.swapped ? "onednn:swapped" : "onednn:" + std::string(entry.pd.impl_info_str()); },
      sizes);
  if (entry.swapped) {
    onednn::swapped::run(*entry.prim, x, *weight, impl_->bias, out, post_ops_residual);
  } else {
    // The weights are the packed copy when there is one (fixed), else the caller's (given per call).
    entry.prim->execute({{DNNL_ARG_SRC, x.data()},
                         {DNNL_ARG_WEIGHTS, entry.packed_weights ? nullptr : weight->data()},
                         {DNNL_ARG_BIAS, impl_->bias.empty() ? nullptr : impl_->bias.data()},
                         {DNNL_ARG_DST, out.data()},
                         onednn::residual_call_arg(post_ops, post_ops_residual)},
                        {{DNNL_ARG_WEIGHTS, entry.packed_weights}});
  }
  split.finish();
}

std::string Linear::implementation(int64_t m, const TensorView* weight) const {
  EMBER_CHECK(m >= 1, ValueError, "Linear.implementation: m must be >= 1, got ", m);
  EMBER_CHECK(weight != nullptr || impl_->options.prepack, ValueError,
              "Linear.implementation: weight must be given to a layer that is not prepacked");
  // Shapes only: these views are never read or written.
  const TensorView x(nullptr, impl_->options.compute, {m, impl_->k});
  if (weight != nullptr && !impl_->options.prepack && skinny::takes(x, *weight)) {
    const Isa isa = skinny::implementation(weight->dtype(), m, impl_->k);
    return std::string("ember:skinny:") + std::string(isa_name(isa));
  }
  const int threads = onednn::use_thread_budget();
  const TensorView out(nullptr, impl_->options.compute, {m, impl_->n});
  const Entry entry = impl_->entry_for(x, weight, out, {}, nullptr, threads);
  return std::string(entry.pd.impl_info_str()) + (entry.swapped ? " (swapped)" : "");
}

}  // namespace ember
