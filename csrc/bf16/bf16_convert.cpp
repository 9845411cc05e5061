// Dispatch, parallel split and argument checks of the bf16 conversions. The per-ISA bodies live in
// bf16_convert_<isa>.cpp; this file runs the best one the cap allows over num_threads() chunks.
#include <string>

#include "bf16_kernels.h"
#include "ember/bf16.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/streaming.h"
#include "ember/trace.h"

namespace ember::bf16 {
namespace {

using namespace kernels;

constexpr IsaImpl<SplitFn> kSplit[] = {{Isa::avx512, split_avx512}, {Isa::avx2, split_avx2}, {Isa::ref, split_ref}};
constexpr IsaImpl<JoinFn> kJoin[] = {{Isa::avx512, join_avx512}, {Isa::avx2, join_avx2}, {Isa::ref, join_ref}};
constexpr IsaImpl<RoundFn> kRound[] = {
    {Isa::avx512_bf16, round_avx512_bf16}, {Isa::avx512, round_avx512}, {Isa::avx2, round_avx2}, {Isa::ref, round_ref}};

// Below ~32K elements (~256 KB moved) a fork/join costs more than the second core saves.
constexpr int64_t kGrain = 1 << 15;
// Chunks start on 64-element boundaries: whole cache lines of the fp32 side, whole vectors for every ISA.
constexpr int64_t kAlign = 64;

KernelTrace trace_call(Op op, Isa isa, int64_t n, bool stream) {
  constexpr std::string_view kNames[] = {"bf16.split", "bf16.join", "bf16.round"};  // in Op's order
  return {kNames[static_cast<int>(op)], isa, [&] { return "n=" + std::to_string(n) + (stream ? ",stream" : ""); }};
}

}  // namespace

std::string_view op_name(Op op) noexcept {
  switch (op) {
    case Op::split: return "split";
    case Op::join: return "join";
    case Op::round: return "round";
  }
  return "?";
}

Isa implementation(Op op) {
  const Isa level = active_isa();
  switch (op) {
    case Op::split: return select_impl(kSplit, level).isa;
    case Op::join: return select_impl(kJoin, level).isa;
    case Op::round: return select_impl(kRound, level).isa;
  }
  return Isa::ref;
}

void split(const float* src, uint16_t* top, uint16_t* bottom, int64_t n) {
  const auto& impl = select_impl(kSplit, active_isa());
  const bool stream = should_stream(8 * n);
  const KernelTrace trace = trace_call(Op::split, impl.isa, n, stream);
  parallel_for(n, kGrain, kAlign, [&](int64_t, int64_t begin, int64_t end) {
    impl.fn(src + begin, top + begin, bottom + begin, end - begin, stream);
  });
}

void join(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n) {
  const auto& impl = select_impl(kJoin, active_isa());
  const bool stream = should_stream(8 * n);
  const KernelTrace trace = trace_call(Op::join, impl.isa, n, stream);
  parallel_for(n, kGrain, kAlign, [&](int64_t, int64_t begin, int64_t end) {
    impl.fn(top + begin, bottom + begin, dst + begin, end - begin, stream);
  });
}

void round(const float* src, uint16_t* dst, int64_t n) {
  const auto& impl = select_impl(kRound, active_isa());
  const bool stream = should_stream(6 * n);
  const KernelTrace trace = trace_call(Op::round, impl.isa, n, stream);
  parallel_for(n, kGrain, kAlign,
               [&](int64_t, int64_t begin, int64_t end) { impl.fn(src + begin, dst + begin, end - begin, stream); });
}

void split(const TensorView& x, const TensorView& top, const TensorView& bottom) {
  constexpr std::string_view op = "bf16.split";
  check::dtype(op, "x", x, DType::f32);
  check::dtype(op, "top", top, DType::bf16);
  check::dtype(op, "bottom", bottom, DType::i16);
  check::same_shape(op, "top", top, "x", x);
  check::same_shape(op, "bottom", bottom, "x", x);
  check::contiguous(op, "x", x);
  check::contiguous(op, "top", top);
  check::contiguous(op, "bottom", bottom);
  check::no_overlap(op, "top", top, "x", x);
  check::no_overlap(op, "bottom", bottom, "x", x);
  check::no_overlap(op, "bottom", bottom, "top", top);
  split(x.data_as<const float>(), top.data_as<uint16_t>(), bottom.data_as<uint16_t>(), x.numel());
}

void join(const TensorView& top, const TensorView& bottom, const TensorView& out) {
  constexpr std::string_view op = "bf16.join";
  check::dtype(op, "top", top, DType::bf16);
  check::dtype(op, "bottom", bottom, DType::i16);
  check::dtype(op, "out", out, DType::f32);
  check::same_shape(op, "bottom", bottom, "top", top);
  check::same_shape(op, "out", out, "top", top);
  check::contiguous(op, "top", top);
  check::contiguous(op, "bottom", bottom);
  check::contiguous(op, "out", out);
  check::no_overlap(op, "out", out, "top", top);
  check::no_overlap(op, "out", out, "bottom", bottom);
  join(top.data_as<const uint16_t>(), bottom.data_as<const uint16_t>(), out.data_as<float>(), top.numel());
}

void round(const TensorView& x, const TensorView& out) {
  constexpr std::string_view op = "bf16.round";
  check::dtype(op, "x", x, DType::f32);
  check::dtype(op, "out", out, DType::bf16);
  check::same_shape(op, "out", out, "x", x);
  if (x.numel() == 0) return;  // (no elements: any strides will do)
  // Any dense layout, the same for both (a channels-last activation rounded for a bf16 convolution): the elements
  // are then one flat run from data() in each, in the same order.
  EMBER_CHECK(x.is_dense() && x.byte_extent() >= 0, ValueError, op, ": x must be dense (contiguous in some order of ",
              "its dimensions), got ", x.describe());
  EMBER_CHECK(out.same_layout(x), ValueError, op, ": out must have x's strides, got ", out.describe());
  check::no_overlap(op, "out", out, "x", x);
  round(x.data_as<const float>(), out.data_as<uint16_t>(), x.numel());
}

}  // namespace ember::bf16
