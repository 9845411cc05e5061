#include "linear/linear_onednn.h"

#include <array>
#include <mutex>
#include <optional>
#include <string_view>

#include "ember/errors.h"
#include "ember/trace.h"
#include "linear/linear_swapped.h"
#include "onednn/onednn_common.h"

namespace ember::linear {
namespace {

using dnnl::memory;
using onednn::engine;

constexpr size_t kCachedPrimitives = 128;  // distinct (M, strides, dtypes, threads): sequence lengths, batches

// Everything a primitive depends on besides the layer itself.
using Key = std::array<int64_t, 12>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept { return onednn::hash_ints(k.data(), k.size()); }
};

struct Entry {
  dnnl::matmul::primitive_desc pd;
  std::shared_ptr<const onednn::BoundPrimitive> prim;
  memory packed_weights;  // empty: the call runs on the caller's weight as it is
  bool swapped = false;   // pd computes outᵀ = W xᵀ (linear_swapped.h)
};

std::shared_ptr<const onednn::BoundPrimitive> bind(const dnnl::matmul::primitive_desc& pd) {
  return std::make_shared<const onednn::BoundPrimitive>(dnnl::matmul(pd), pd);
}

// The caller's [N, K] weight as the matmul's B [K, N].
memory::desc weight_as_b(const TensorView& w) {
  return memory::desc({w.size(1), w.size(0)}, onednn::to_dnnl(w.dtype()), {w.stride(1), w.stride(0)});
}

}  // namespace

struct OnednnMatmul::Impl {
  int64_t n = 0, k = 0;
  Linear::Options options;
  const std::vector<float>& bias;  // empty: no bias
  mutable std::mutex mutex;
  mutable onednn::LruCache<Key, Entry, KeyHash> cache{kCachedPrimitives};
  mutable onednn::PackedWeights packed;
  TileWeights tiles;  // set by the constructor only

  Impl(int64_t n, int64_t k, const Linear::Options& options, const std::vector<float>& bias)
      : n(n), k(k), options(options), bias(bias) {}

  Entry entry_for(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out,
                  const Epilogue& epilogue, const TensorView* residual, int threads) const;
  Entry make_entry(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out,
                   const Epilogue& epilogue, const TensorView* residual) const;
  dnnl::matmul::primitive_desc make_pd(const memory::desc& x, const memory::desc& w, const memory::desc& out,
                                       const Epilogue& epilogue, const memory::desc& residual) const;
};

OnednnMatmul::OnednnMatmul(const TensorView& weight, const std::vector<float>& bias, const Linear::Options& options)
    : impl_(std::make_unique<Impl>(weight.size(0), weight.size(1), options, bias)) {
  if (!options.prepack) return;
  // Shapes only: these views are never read or written.
  const TensorView x(nullptr, options.compute, {options.rows_hint, impl_->k});
  const TensorView out(nullptr, options.compute, {options.rows_hint, impl_->n});
  // Only the weight is packed: primitives are built by the calls that use them (each with its epilogue), so none
  // is JIT-compiled here for nothing.
  const memory::desc any({impl_->k, impl_->n}, onednn::to_dnnl(options.compute), memory::format_tag::any);
  onednn::use_thread_budget();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const dnnl::matmul::primitive_desc pd = impl_->make_pd(onednn::md_of(x), any, onednn::md_of(out), {}, {});
  const memory copy = impl_->packed.pack(memory(weight_as_b(weight), engine(), weight.data()), pd.weights_desc());
  if (options.compute == DType::bf16) {
    const memory::desc& md = copy.get_desc();
    const memory::dims strides = md.get_strides();
    const auto layout = tile_matmul::layout_from_blocking(impl_->k, impl_->n, md.get_inner_blks(), md.get_inner_idxs(),
                                                          strides[0], strides[1]);
    if (layout) {
      auto* data = static_cast<uint16_t*>(copy.get_data_handle());
      tile_matmul::zero_k_padding(data, *layout);
      impl_->tiles = {data, *layout};
    }
  }
}

const OnednnMatmul::TileWeights& OnednnMatmul::tile_weights() const noexcept { return impl_->tiles; }

OnednnMatmul::~OnednnMatmul() = default;

size_t OnednnMatmul::packed_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->packed.bytes();
}

size_t OnednnMatmul::cached_primitives() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cache.size();
}

dnnl::matmul::primitive_desc OnednnMatmul::Impl::make_pd(const memory::desc& x, const memory::desc& w,
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

Entry OnednnMatmul::Impl::make_entry(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out,
                                     const Epilogue& epilogue, const TensorView* residual) const {
  const memory::desc x_md = onednn::md_of(x);
  const memory::desc out_md = onednn::md_of(out);
  const memory::desc res_md = residual ? onednn::md_of(*residual) : memory::desc();
  Entry entry;
  if (swapped) {
    try {
      entry.pd = swapped::make_pd(x, *weight, !bias.empty());
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

Entry OnednnMatmul::Impl::entry_for(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out,
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
                options.prepack ? -1 : weight->stride(1),
                swapped ? 1 : 0};
  std::lock_guard<std::mutex> lock(mutex);
  if (Entry* hit = cache.find(key)) return *hit;
  return cache.insert(key, make_entry(swapped, x, weight, out, epilogue, residual));
}

void OnednnMatmul::run(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out,
                       const Epilogue& epilogue, const TensorView* residual) const {
  const int threads = onednn::use_thread_budget();
  // A leading GELU runs in the primitive where no sum can leave the finite floats (onednn::fuses_gelu says why): on a
  // packed copy only, whose weights cannot change under it, and never in the transposed matmul, whose primitive
  // takes no activation (it serves fp32 outputs only, which fuses_gelu never takes).
  const bool gelu_in_primitive = !swapped && impl_->options.prepack &&
                                 onednn::gelu_in_primitive(epilogue, x, out, impl_->packed, impl_->mutex, impl_->bias);
  const onednn::EpilogueSplit split(epilogue, residual, out, gelu_in_primitive);
  const Epilogue& post_ops = split.post_ops();
  const TensorView* post_ops_residual = split.post_ops_residual();
  const Entry entry = impl_->entry_for(swapped, x, weight, out, post_ops, post_ops_residual, threads);
  const KernelTrace trace(
      "linear", [&] { return entry.swapped ? "onednn:swapped" : "onednn:" + std::string(entry.pd.impl_info_str()); },
      [&] {
        return "m=" + std::to_string(x.size(0)) + ",n=" + std::to_string(impl_->n) + ",k=" + std::to_string(impl_->k) +
               "," + std::string(dtype_name(impl_->options.compute)) + ",out=" + std::string(dtype_name(out.dtype())) +
               split.describe();
      });
  if (entry.swapped) {
    swapped::run(*entry.prim, x, *weight, impl_->bias, out, post_ops_residual);
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

std::string OnednnMatmul::implementation(bool swapped, const TensorView& x, const TensorView* weight,
                                         const TensorView& out) const {
  const int threads = onednn::use_thread_budget();
  const Entry entry = impl_->entry_for(swapped, x, weight, out, {}, nullptr, threads);
  return std::string(entry.pd.impl_info_str()) + (entry.swapped ? " (swapped)" : "");
}

}  // namespace ember::linear
