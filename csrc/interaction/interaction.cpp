// Dot interaction: argument checks and the split of the batch over threads. The arithmetic lives in
// interaction_body.inl.
#include "ember/interaction.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/trace.h"
#include "interaction_kernels.h"

namespace ember::interaction {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "interaction";

template <typename W>
constexpr IsaImpl<Fn<W>> kForward[3] = {
    {Isa::avx512, forward_avx512<W>}, {Isa::avx2, forward_avx2<W>}, {Isa::ref, forward_ref<W>}};
// bfloat16 has a level more: vdpbf16ps reads the rows as they lie (no widening) at twice the products an instruction.
constexpr IsaImpl<Fn<uint16_t>> kForwardBf16[] = {{Isa::avx512_bf16, forward_avx512_bf16},
                                                  {Isa::avx512, forward_avx512<uint16_t>},
                                                  {Isa::avx2, forward_avx2<uint16_t>},
                                                  {Isa::ref, forward_ref<uint16_t>}};
template <typename W>
constexpr IsaImpl<Fn<W>> kBackward[3] = {
    {Isa::avx512, backward_avx512<W>}, {Isa::avx2, backward_avx2<W>}, {Isa::ref, backward_ref<W>}};
// float64 has one path, on every machine: there for gradient checks and float64 references.
constexpr IsaImpl<Fn<double>> kForwardF64[] = {{Isa::ref, forward_f64}};
constexpr IsaImpl<Fn<double>> kBackwardF64[] = {{Isa::ref, backward_f64}};

// A sample costs about n^2 * dim multiply-adds; a chunk of samples should be worth a fork/join (tens of us).
int64_t grain(int64_t n, int64_t dim) {
  return std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, n * n * dim));
}

// Checks the inputs (and the per-input tensors of `other`, if given) and returns B and D.
std::pair<int64_t, int64_t> check_inputs(const std::vector<TensorView>& inputs, std::vector<check::ListItem>& items) {
  EMBER_CHECK(!inputs.empty(), ValueError, kOp, ": needs at least the dense input");
  EMBER_CHECK(inputs.size() <= 4096, ValueError, kOp, ": at most 4096 inputs, got ", inputs.size());
  const TensorView& first = inputs[0];
  EMBER_CHECK(first.ndim() == 2, ValueError, kOp, ": inputs[0] (dense) must be 2-D [batch, dim], got ",
              first.describe());
  EMBER_CHECK(first.dtype() == DType::f32 || first.dtype() == DType::bf16 || first.dtype() == DType::f64, TypeError,
              kOp, ": inputs must have dtype float32, bfloat16 or float64, got ", dtype_name(first.dtype()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    check::dtype(kOp, check::item_name("inputs", i), inputs[i], first.dtype());
    check::same_shape(kOp, check::item_name("inputs", i), inputs[i], "inputs[0]", first);
    check::contiguous(kOp, check::item_name("inputs", i), inputs[i]);
    items.push_back({"inputs", i, &inputs[i], false});
  }
  return {first.size(0), first.size(1)};
}

// The output, or its gradient: [batch, width] of the inputs' dtype, contiguous.
void check_pairs_tensor(std::string_view name, const TensorView& t, DType dtype, int64_t batch, int64_t width) {
  check::dtype(kOp, name, t, dtype);
  check::contiguous(kOp, name, t);
  EMBER_CHECK(t.ndim() == 2 && t.size(0) == batch && t.size(1) == width, ValueError, kOp, ": ", name, " must be [",
              batch, ", ", width, "], got ", t.describe());
}

template <typename W, size_t N>
void run(const IsaImpl<Fn<W>> (&impls)[N], Args<W>& a, int64_t batch, std::string_view what) {
  const auto& impl = select_impl(impls, active_isa());
  const KernelTrace trace(what, impl.isa, [&] {
    return "batch=" + std::to_string(batch) + ",n=" + std::to_string(a.n) + ",dim=" + std::to_string(a.dim);
  });
  parallel_for(batch, grain(a.n, a.dim), 1, [&](int64_t, int64_t begin, int64_t end) { impl.fn(a, begin, end); });
}

}  // namespace

Isa implementation() { return select_impl(kForward<float>, active_isa()).isa; }

int64_t output_width(int64_t inputs, int64_t dim) noexcept { return dim + inputs * (inputs - 1) / 2; }

void forward(const std::vector<TensorView>& inputs, const TensorView& out) {
  std::vector<check::ListItem> items;
  const auto [batch, dim] = check_inputs(inputs, items);
  const auto n = static_cast<int64_t>(inputs.size());
  const int64_t width = output_width(n, dim);
  check_pairs_tensor("out", out, inputs[0].dtype(), batch, width);
  items.push_back({"out", 0, &out, true});
  check::no_overlaps(kOp, items);
  auto launch = [&](auto w) {
    using W = decltype(w);
    std::vector<const W*> pointers;
    pointers.reserve(inputs.size());
    for (const TensorView& v : inputs) pointers.push_back(v.data_as<const W>());
    Args<W> a;
    a.inputs = pointers.data();
    a.n = static_cast<int>(n);
    a.dim = dim;
    a.out = out.data_as<W>();
    a.width = width;
    if constexpr (std::is_same_v<W, uint16_t>) {
      run(kForwardBf16, a, batch, kOp);
    } else if constexpr (std::is_same_v<W, double>) {
      run(kForwardF64, a, batch, kOp);
    } else {
      run(kForward<W>, a, batch, kOp);
    }
  };
  with_float_storage(inputs[0].dtype(), launch);
}

void backward(const std::vector<TensorView>& inputs, const TensorView& grad_out,
              const std::vector<TensorView>& grad_inputs) {
  std::vector<check::ListItem> items;
  const auto [batch, dim] = check_inputs(inputs, items);
  const auto n = static_cast<int64_t>(inputs.size());
  const int64_t width = output_width(n, dim);
  check_pairs_tensor("grad_out", grad_out, inputs[0].dtype(), batch, width);
  items.push_back({"grad_out", 0, &grad_out, false});
  EMBER_CHECK(grad_inputs.size() == inputs.size(), ValueError, kOp, ": grad_inputs must have one tensor per input (",
              inputs.size(), "), got ", grad_inputs.size());
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    check::dtype(kOp, check::item_name("grad_inputs", i), grad_inputs[i], inputs[0].dtype());
    check::same_shape(kOp, check::item_name("grad_inputs", i), grad_inputs[i], "inputs[0]", inputs[0]);
    check::contiguous(kOp, check::item_name("grad_inputs", i), grad_inputs[i]);
    items.push_back({"grad_inputs", i, &grad_inputs[i], true});
  }
  check::no_overlaps(kOp, items);
  auto launch = [&](auto w) {
    using W = decltype(w);
    std::vector<const W*> pointers;
    std::vector<W*> grads;
    pointers.reserve(inputs.size());
    grads.reserve(grad_inputs.size());
    for (const TensorView& v : inputs) pointers.push_back(v.data_as<const W>());
    for (const TensorView& v : grad_inputs) grads.push_back(v.data_as<W>());
    Args<W> a;
    a.inputs = pointers.data();
    a.n = static_cast<int>(n);
    a.dim = dim;
    a.grad_out = grad_out.data_as<const W>();
    a.grad_inputs = grads.data();
    a.width = width;
    if constexpr (std::is_same_v<W, double>) {
      run(kBackwardF64, a, batch, "interaction_backward");
    } else {
      run(kBackward<W>, a, batch, "interaction_backward");
    }
  };
  with_float_storage(inputs[0].dtype(), launch);
}

}  // namespace ember::interaction
