// ember::Convolution on oneDNN's convolution_forward and deconvolution_forward. torch's weight is read through
// strides as oneDNN's logical weights ([OC, IC, k...], or [G, OC/G, IC/G, k...] when grouped), so the one reorder
// into the blocked layout is the only copy ever made of it.
#include "ember/convolution.h"

#include <algorithm>
#include <mutex>

#include "ember/errors.h"
#include "ember/trace.h"
#include "onednn/onednn_common.h"

namespace ember {
namespace {

using dnnl::memory;
using onednn::engine;

constexpr size_t kCachedPrimitives = 64;  // distinct input shapes, layouts, epilogues and thread counts

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept { return onednn::hash_ints(k.data(), k.size()); }
};

// A descriptor of either kind; both have the queries forward() needs.
struct Entry {
  dnnl::primitive_desc pd;
  std::shared_ptr<const onednn::BoundPrimitive> prim;
  memory weights;
};

}  // namespace

struct Convolution::Impl {
  Geometry geometry;
  Options options;
  int spatial = 0;
  int64_t in_channels = 0, out_channels = 0;
  std::vector<int64_t> kernel;  // spatial sizes of the kernel
  std::vector<float> bias;      // empty: no bias
  mutable std::mutex mutex;
  mutable onednn::LruCache<Key, Entry, KeyHash> cache{kCachedPrimitives};
  mutable onednn::PackedWeights packed;

  memory::desc weights_md(const TensorView& w) const;
  memory::desc any_weights_md() const;
  std::vector<int64_t> output_shape(const int64_t* input, int ndim) const;
  void check(const TensorView& x, const TensorView& out, const Epilogue& epilogue, const TensorView* residual,
             bool in_place) const;
  dnnl::primitive_desc make_pd(const memory::desc& x, const memory::desc& w, const memory::desc& out,
                               const Epilogue& epilogue, const memory::desc& residual, bool in_place) const;
  Entry make_entry(const TensorView& x, const TensorView& out, const Epilogue& epilogue, const TensorView* residual,
                   bool in_place) const;
  // in_place: out is the residual itself (onednn::accumulates_in_place), added by a sum post-op.
  Entry entry_for(const TensorView& x, const TensorView& out, const Epilogue& epilogue, const TensorView* residual,
                  bool in_place, int threads) const;
};

namespace {

void check_geometry(const Convolution::Geometry& g, int spatial) {
  const auto n = static_cast<size_t>(spatial);
  EMBER_CHECK(g.stride.size() == n && g.padding_l.size() == n && g.padding_r.size() == n && g.dilation.size() == n,
              ValueError, "Convolution: stride, padding_l, padding_r and dilation must each have ", spatial,
              " entries (one per spatial dimension of the weight)");
  for (size_t i = 0; i < n; ++i) {
    EMBER_CHECK(g.stride[i] >= 1, ValueError, "Convolution: stride must be >= 1, got ", g.stride[i]);
    EMBER_CHECK(g.dilation[i] >= 1, ValueError, "Convolution: dilation must be >= 1, got ", g.dilation[i]);
    EMBER_CHECK(g.padding_l[i] >= 0 && g.padding_r[i] >= 0, ValueError,
                "Convolution: padding must be >= 0 on both sides, got ", g.padding_l[i], " and ", g.padding_r[i],
                g.transposed ? " (a transposed convolution's output_padding may not exceed its padding)" : "");
  }
  EMBER_CHECK(g.groups >= 1, ValueError, "Convolution: groups must be >= 1, got ", g.groups);
}

}  // namespace

memory::desc Convolution::Impl::weights_md(const TensorView& w) const {
  // torch: convolution [OC, IC/G, k...], transposed [IC, OC/G, k...]. oneDNN: [OC, IC, k...] or [G, OC/G, IC/G, k...]
  // for both kinds.
  const int64_t g = geometry.groups;
  const int64_t s0 = w.stride(0), s1 = w.stride(1);
  memory::dims dims, strides;
  if (g > 1) {
    dims = {g, out_channels / g, in_channels / g};
    strides = geometry.transposed ? memory::dims{(in_channels / g) * s0, s1, s0}
                                  : memory::dims{(out_channels / g) * s0, s0, s1};
  } else {
    dims = {out_channels, in_channels};
    strides = geometry.transposed ? memory::dims{s1, s0} : memory::dims{s0, s1};
  }
  for (int d = 0; d < spatial; ++d) {
    dims.push_back(kernel[d]);
    strides.push_back(w.stride(2 + d));
  }
  return memory::desc(dims, onednn::to_dnnl(w.dtype()), strides);
}

memory::desc Convolution::Impl::any_weights_md() const {
  const int64_t g = geometry.groups;
  memory::dims dims =
      g > 1 ? memory::dims{g, out_channels / g, in_channels / g} : memory::dims{out_channels, in_channels};
  dims.insert(dims.end(), kernel.begin(), kernel.end());
  return memory::desc(dims, onednn::to_dnnl(options.compute), memory::format_tag::any);
}

std::vector<int64_t> Convolution::Impl::output_shape(const int64_t* input, int ndim) const {
  EMBER_CHECK(ndim == spatial + 2, ValueError, "Convolution: input must have ", spatial + 2,
              " dimensions [N, C, spatial...], got ", ndim);
  EMBER_CHECK(input[1] == in_channels, ValueError, "Convolution: input must have ", in_channels, " channels, got ",
              input[1]);
  std::vector<int64_t> out{input[0], out_channels};
  for (int d = 0; d < spatial; ++d) {
    const int64_t extent = geometry.dilation[d] * (kernel[d] - 1) + 1;
    const int64_t pads = geometry.padding_l[d] + geometry.padding_r[d];
    int64_t size = 0;
    if (geometry.transposed) {
      size = (input[2 + d] - 1) * geometry.stride[d] - pads + extent;
    } else {
      const int64_t room = input[2 + d] + pads - extent;
      size = room < 0 ? 0 : room / geometry.stride[d] + 1;
    }
    EMBER_CHECK(input[2 + d] >= 1 && size >= 1, ValueError, "Convolution: spatial dimension ", d, " of size ",
                input[2 + d], " leaves no output with this kernel, stride, padding and dilation");
    out.push_back(size);
  }
  return out;
}

Convolution::Convolution(const TensorView& weight, const TensorView* bias, Geometry geometry, Options options,
                         const TensorView& input_hint)
    : impl_(std::make_unique<Impl>()) {
  EMBER_CHECK(weight.ndim() >= 3 && weight.ndim() <= 5, ValueError,
              "Convolution: weight must have 3 to 5 dimensions [out, in/groups, k...], got ", weight.describe());
  EMBER_CHECK(weight.numel() > 0, ValueError, "Convolution: weight must not be empty, got ", weight.describe());
  EMBER_CHECK(weight.dtype() == DType::f32 || weight.dtype() == DType::bf16, TypeError,
              "Convolution: weight must be float32 or bfloat16, got ", dtype_name(weight.dtype()));
  EMBER_CHECK(onednn::is_compute_dtype(options.compute), TypeError,
              "Convolution: compute dtype must be float32, bfloat16 or float16, got ", dtype_name(options.compute));
  Impl& im = *impl_;
  im.spatial = weight.ndim() - 2;
  check_geometry(geometry, im.spatial);
  const int64_t g = geometry.groups;
  if (geometry.transposed) {
    EMBER_CHECK(weight.size(0) % g == 0, ValueError, "Convolution: a transposed weight's first dimension (",
                weight.size(0), ") must be divisible by groups (", g, ")");
    im.in_channels = weight.size(0);
    im.out_channels = weight.size(1) * g;
  } else {
    EMBER_CHECK(weight.size(0) % g == 0, ValueError, "Convolution: out_channels (", weight.size(0),
                ") must be divisible by groups (", g, ")");
    im.out_channels = weight.size(0);
    im.in_channels = weight.size(1) * g;
  }
  im.kernel.assign(weight.sizes() + 2, weight.sizes() + weight.ndim());
  im.geometry = std::move(geometry);
  im.options = options;
  EMBER_CHECK(supported(options.compute), RuntimeError, "Convolution: oneDNN has no ", dtype_name(options.compute),
              " convolution on this CPU (it needs AVX-512); Convolution::supported() says so before construction");
  if (bias != nullptr) im.bias = onednn::bias_to_f32("Convolution", *bias, im.out_channels);
  EMBER_CHECK(input_hint.dtype() == options.compute, TypeError, "Convolution: input_hint must be ",
              dtype_name(options.compute), ", got ", dtype_name(input_hint.dtype()));
  const std::vector<int64_t> hint_out = im.output_shape(input_hint.sizes(), input_hint.ndim());
  const std::vector<int64_t> out_strides = onednn::strides_like(input_hint, hint_out.data());
  // Shapes only: these views are never read or written.
  const TensorView out(nullptr, options.compute, hint_out.data(), out_strides.data(), input_hint.ndim());
  const memory source(im.weights_md(weight), engine(), weight.data());
  // Only the weights are packed now: the primitive the hint would get is built at the first call, which may well
  // be fused (an epilogue is part of a primitive), so building one here could be JIT work for nothing.
  onednn::use_thread_budget();
  std::lock_guard<std::mutex> lock(im.mutex);
  const dnnl::primitive_desc pd =
      im.make_pd(onednn::md_of(input_hint), im.any_weights_md(), onednn::md_of(out), {}, {}, false);
  im.packed.pack(source, pd.query_md(dnnl::query::weights_md));
}

Convolution::~Convolution() = default;

namespace {

std::string convolution_implementation(DType compute) {
  const memory::data_type t = onednn::to_dnnl(compute);
  const memory::desc x({1, 16, 4, 4}, t, memory::format_tag::nhwc);
  const memory::desc w({16, 16, 3, 3}, t, memory::format_tag::any);
  const memory::desc y({1, 16, 2, 2}, t, memory::format_tag::nhwc);
  const dnnl::convolution_forward::primitive_desc pd(engine(), dnnl::prop_kind::forward_inference,
                                                     dnnl::algorithm::convolution_direct, x, w, y, {1, 1}, {0, 0},
                                                     {0, 0});
  return pd.impl_info_str();
}

}  // namespace

bool Convolution::supported(DType compute) {
  static const bool bf16 = onednn::compute_supported(DType::bf16, convolution_implementation);
  static const bool f16 = onednn::compute_supported(DType::f16, convolution_implementation);
  return compute == DType::f32 || (compute == DType::bf16 && bf16) || (compute == DType::f16 && f16);
}

std::vector<int64_t> Convolution::output_shape(const std::vector<int64_t>& input) const {
  return impl_->output_shape(input.data(), static_cast<int>(input.size()));
}

int64_t Convolution::in_channels() const noexcept { return impl_->in_channels; }
int64_t Convolution::out_channels() const noexcept { return impl_->out_channels; }
const Convolution::Geometry& Convolution::geometry() const noexcept { return impl_->geometry; }
const Convolution::Options& Convolution::options() const noexcept { return impl_->options; }

size_t Convolution::packed_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->packed.bytes();
}

size_t Convolution::cached_primitives() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cache.size();
}

void Convolution::Impl::check(const TensorView& x, const TensorView& out, const Epilogue& epilogue,
                              const TensorView* residual, bool in_place) const {
  const DType compute = options.compute;
  check::dtype("Convolution", "x", x, compute);
  const std::vector<int64_t> expected = output_shape(x.sizes(), x.ndim());
  const bool shape_ok = out.ndim() == x.ndim() && std::equal(expected.begin(), expected.end(), out.sizes());
  if (!shape_ok) {
    const TensorView shaped(nullptr, out.dtype(), expected.data(), expected.data(), x.ndim());
    throw ValueError(detail::concat("Convolution: out must have shape ", shaped.describe(), ", got ", out.describe()));
  }
  onednn::check_output("Convolution", compute, x, out, epilogue, residual, in_place);
}

dnnl::primitive_desc Convolution::Impl::make_pd(const memory::desc& x, const memory::desc& w, const memory::desc& out,
                                                const Epilogue& epilogue, const memory::desc& residual,
                                                bool in_place) const {
  const dnnl::primitive_attr attr = onednn::make_attr(epilogue, residual, in_place);
  const memory::dims stride(geometry.stride.begin(), geometry.stride.end());
  const memory::dims pad_l(geometry.padding_l.begin(), geometry.padding_l.end());
  const memory::dims pad_r(geometry.padding_r.begin(), geometry.padding_r.end());
  memory::dims dilate;  // oneDNN counts the gaps: 0 is a dense kernel
  for (int64_t d : geometry.dilation) dilate.push_back(d - 1);
  const memory::desc bias_md =
      bias.empty() ? memory::desc() : memory::desc({out_channels}, memory::data_type::f32, memory::format_tag::a);
  const auto inference = dnnl::prop_kind::forward_inference;
  try {
    if (geometry.transposed) {
      return dnnl::deconvolution_forward::primitive_desc(engine(), inference, dnnl::algorithm::deconvolution_direct, x,
                                                         w, bias_md, out, stride, dilate, pad_l, pad_r, attr);
    }
    return dnnl::convolution_forward::primitive_desc(engine(), inference, dnnl::algorithm::convolution_direct, x, w,
                                                     bias_md, out, stride, dilate, pad_l, pad_r, attr);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    throw RuntimeError(detail::concat("Convolution: oneDNN has no ", dtype_name(options.compute), " ",
                                      geometry.transposed ? "transposed " : "",
                                      "convolution for this CPU and these arguments"));
  }
}

Entry Convolution::Impl::make_entry(const TensorView& x, const TensorView& out, const Epilogue& epilogue,
                                    const TensorView* residual, bool in_place) const {
  const memory::desc x_md = onednn::md_of(x), out_md = onednn::md_of(out);
  const memory::desc res_md = residual ? onednn::md_of(*residual) : memory::desc();
  Entry entry;
  entry.pd = make_pd(x_md, any_weights_md(), out_md, epilogue, res_md, in_place);
  entry.weights = packed.select(
      entry.pd, [&](const memory::desc& layout) { return make_pd(x_md, layout, out_md, epilogue, res_md, in_place); },
      nullptr);
  entry.prim = std::make_shared<const onednn::BoundPrimitive>(dnnl::primitive(entry.pd), entry.pd);
  return entry;
}

Entry Convolution::Impl::entry_for(const TensorView& x, const TensorView& out, const Epilogue& epilogue,
                                   const TensorView* residual, bool in_place, int threads) const {
  Key key;
  key.reserve(4 * static_cast<size_t>(x.ndim()) + 6);
  key.insert(key.end(), x.sizes(), x.sizes() + x.ndim());
  // The stride of a size-1 dimension addresses nothing (torch versions set it differently): keyed as 0, so
  // equal layouts share a primitive.
  auto add_strides = [&key](const TensorView& t) {
    for (int d = 0; d < t.ndim(); ++d) key.push_back(t.size(d) == 1 ? 0 : t.stride(d));
  };
  add_strides(x);
  add_strides(out);
  key.push_back(static_cast<int64_t>(out.dtype()));
  if (residual != nullptr) {
    add_strides(*residual);
    key.push_back(static_cast<int64_t>(residual->dtype()));
    key.push_back(in_place ? 1 : 0);  // a sum post-op, not a binary one
  }
  key.push_back(threads);
  key.push_back(onednn::epilogue_code(epilogue));
  std::lock_guard<std::mutex> lock(mutex);
  if (Entry* hit = cache.find(key)) return *hit;
  return cache.insert(key, make_entry(x, out, epilogue, residual, in_place));
}

void Convolution::forward(const TensorView& x, const TensorView& out, const Epilogue& epilogue,
                          const TensorView* residual) const {
  const bool in_place = onednn::accumulates_in_place(epilogue, residual, out);
  impl_->check(x, out, epilogue, residual, in_place);
  if (x.size(0) == 0) return;
  const int threads = onednn::use_thread_budget();
  // A leading GELU runs in the primitive where no sum can leave the finite floats (onednn::fuses_gelu says why).
  const bool gelu_in_primitive = onednn::gelu_in_primitive(epilogue, x, out, impl_->packed, impl_->mutex, impl_->bias);
  const onednn::EpilogueSplit split(epilogue, residual, out, gelu_in_primitive);
  const Entry entry = impl_->entry_for(x, out, split.post_ops(), split.post_ops_residual(), in_place, threads);
  const KernelTrace trace(
      "convolution", [&] { return "onednn:" + std::string(entry.pd.impl_info_str()); },
      [&] { return "x=" + x.describe() + ",out=" + out.describe() + split.describe(); });

  entry.prim->execute({{DNNL_ARG_SRC, x.data()},
                       {DNNL_ARG_BIAS, impl_->bias.empty() ? nullptr : impl_->bias.data()},
                       {DNNL_ARG_DST, out.data()},
                       onednn::residual_call_arg(split.post_ops(), split.post_ops_residual(), in_place)},
                      {{DNNL_ARG_WEIGHTS, entry.weights}});
  split.finish();
}

std::string Convolution::implementation(const TensorView& x) const {
  check::dtype("Convolution.implementation", "x", x, impl_->options.compute);
  const std::vector<int64_t> shape = impl_->output_shape(x.sizes(), x.ndim());
  const std::vector<int64_t> strides = onednn::strides_like(x, shape.data());
  // Shapes only: never read or written.
  const TensorView out(nullptr, impl_->options.compute, shape.data(), strides.data(), x.ndim());
  const int threads = onednn::use_thread_budget();
  return impl_->entry_for(x, out, {}, nullptr, false, threads).pd.impl_info_str();
}

}  // namespace ember
