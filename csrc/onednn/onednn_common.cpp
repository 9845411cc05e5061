#include "onednn/onednn_common.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/growing_buffer.h"
#include "core/magnitude.h"
#include "core/thread_placement.h"
#include "ember/bf16.h"
#include "ember/cpu_features.h"
#include "ember/errors.h"
#include "ember/parallel.h"
#include "epilogue/epilogue_rows.h"

namespace ember::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

int use_thread_budget() {
  const int threads = num_threads();
  detail::openmp_set_calling_thread_budget(threads);
  return threads;
}

namespace {

// The calling thread's stream and scratchpad, shared by every primitive the thread runs.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine());
  return stream;
}

void* thread_scratchpad(size_t bytes) {
  thread_local GrowingBuffer scratchpad;
  return bytes > 0 ? scratchpad.get(bytes) : nullptr;
}

}  // namespace

void execute(const dnnl::primitive& prim, const dnnl::primitive_desc_base& pd, std::unordered_map<int, memory>& args) {
  const memory::desc scratch_md = pd.scratchpad_desc();
  if (void* scratch = thread_scratchpad(scratch_md.get_size())) {
    args[DNNL_ARG_SCRATCHPAD] = memory(scratch_md, engine(), scratch);
  }
  dnnl::stream& stream = thread_stream();
  prim.execute(stream, args);
  stream.wait();
}

BoundPrimitive::BoundPrimitive(dnnl::primitive prim, const dnnl::primitive_desc_base& pd)
    : prim_(std::move(prim)),
      pd_(pd),
      scratchpad_md_(pd.scratchpad_desc()),
      scratchpad_bytes_(scratchpad_md_.get_size()) {}

const memory& BoundPrimitive::point(int slot, const void* data) const {
  void* handle = const_cast<void*>(data);  // oneDNN takes one pointer type for what it reads and what it writes
  for (auto& [kept_slot, mem] : kept_) {
    if (kept_slot == slot) {
      mem.set_data_handle(handle);
      return mem;
    }
  }
  const memory::desc md = slot == DNNL_ARG_SCRATCHPAD ? scratchpad_md_ : pd_.query_md(dnnl::query::exec_arg_md, slot);
  kept_.emplace_back(slot, memory(md, engine(), handle));
  return kept_.back().second;
}

void BoundPrimitive::execute(std::initializer_list<CallArg> args,
                             std::initializer_list<std::pair<int, memory>> fixed) const {
  dnnl::stream& stream = thread_stream();
  void* scratch = thread_scratchpad(scratchpad_bytes_);
  if (busy_.test_and_set(std::memory_order_acquire)) {  // in use on another thread: a set of this call's own
    std::unordered_map<int, memory> own;
    for (const CallArg& arg : args) {
      if (arg.data == nullptr) continue;
      own.emplace(arg.slot,
                  memory(pd_.query_md(dnnl::query::exec_arg_md, arg.slot), engine(), const_cast<void*>(arg.data)));
    }
    for (const auto& [slot, mem] : fixed) {
      if (mem) own.emplace(slot, mem);
    }
    if (scratch != nullptr) own.emplace(DNNL_ARG_SCRATCHPAD, memory(scratchpad_md_, engine(), scratch));
    prim_.execute(stream, own);
    stream.wait();
    return;
  }
  struct Release {
    std::atomic_flag& flag;
    ~Release() { flag.clear(std::memory_order_release); }
  } release{busy_};
  std::array<dnnl_exec_arg_t, kMaxArgs> c_args{};
  size_t n = 0;
  const auto add = [&](int slot, const memory& mem) {
    EMBER_CHECK(n < kMaxArgs, RuntimeError, "BoundPrimitive: more than ", kMaxArgs, " arguments");
    c_args[n++] = {slot, mem.get()};
  };
  for (const CallArg& arg : args) {
    if (arg.data != nullptr) add(arg.slot, point(arg.slot, arg.data));
  }
  for (const auto& [slot, mem] : fixed) {
    if (mem) add(slot, mem);
  }
  if (scratch != nullptr) add(DNNL_ARG_SCRATCHPAD, point(DNNL_ARG_SCRATCHPAD, scratch));
  dnnl::error::wrap_c_api(dnnl_primitive_execute(prim_.get(), stream.get(), static_cast<int>(n), c_args.data()),
                          "could not execute a primitive");
  stream.wait();
}

std::vector<int64_t> strides_like(const TensorView& like, const int64_t* sizes) {
  const int nd = like.ndim();
  std::vector<int> order(static_cast<size_t>(nd));
  std::iota(order.begin(), order.end(), 0);
  // Outermost first; ties (size-1 dimensions) keep torch's row-major order.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  int64_t step = 1;
  for (int i = nd - 1; i >= 0; --i) {
    strides[order[i]] = step;
    step *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return strides;
}

bool primitive_reads(const TensorView& residual) noexcept {
  if (residual.dtype() == DType::f32) return true;
  // oneDNN's ISAs are bit sets, each containing the ones below it: is_superset's test.
  static const bool avx512 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & core) == core;
  }();
  return avx512;
}

bool primitive_adds(const Epilogue& epilogue, const TensorView* residual) noexcept {
  return !epilogue.empty() && epilogue.front().kind == PostOp::Kind::add &&
         (residual == nullptr || primitive_reads(*residual));
}

EpilogueSplit::EpilogueSplit(const Epilogue& epilogue, const TensorView* residual, const TensorView& out,
                             bool gelu_in_primitive)
    : whole_(epilogue), residual_(residual), out_(out) {
  // The primitive runs the leading adds, unless it would read the residual slowly (primitive_reads) and does not
  // accumulate into it in place (a sum post-op reads the output's own dtype, and the output overwrites the residual).
  const bool primitive_may_add =
      residual == nullptr || primitive_reads(*residual) || accumulates_in_place(epilogue, residual, out);
  auto first = !primitive_may_add ? epilogue.begin()
                                  : std::find_if(epilogue.begin(), epilogue.end(),
                                                 [](const PostOp& op) { return op.kind != PostOp::Kind::add; });
  if (gelu_in_primitive) first = epilogue.begin() + 1;
  if (first == epilogue.end()) return;
  split_ = true;
  head_.assign(epilogue.begin(), first);
  tail_.assign(first, epilogue.end());
}

void EpilogueSplit::finish() const {
  if (split_) epilogue::finish_from(tail_, out_, has_operand(tail_) ? residual_ : nullptr, out_);
}

std::string EpilogueSplit::describe() const {
  std::string text;
  const Epilogue& fused = post_ops();
  if (!fused.empty()) {
    text += ",fused=" + epilogue_name(fused);
    if (const TensorView* operand = post_ops_residual()) {
      text +=
          accumulates_in_place(fused, operand, out_) ? "(sum)" : "(" + std::string(dtype_name(operand->dtype())) + ")";
    }
  }
  if (split_) text += ",after=" + epilogue_name(tail_);
  return text;
}

bool fuses_gelu(const Epilogue& epilogue, const TensorView& out) noexcept {
  return !epilogue.empty() && epilogue.front().kind == PostOp::Kind::activation &&
         is_gelu(epilogue.front().activation) && out.dtype() == DType::bf16;
}

bool accumulates_in_place(const Epilogue& epilogue, const TensorView* residual, const TensorView& out) noexcept {
  if (residual == nullptr || epilogue.empty() || epilogue.front().kind != PostOp::Kind::add) return false;
  if (residual->data() != out.data() || residual->dtype() != out.dtype() || residual->ndim() != out.ndim()) {
    return false;
  }
  for (int d = 0; d < out.ndim(); ++d) {
    if (residual->size(d) != out.size(d) || (out.size(d) > 1 && residual->stride(d) != out.stride(d))) return false;
  }
  return true;
}

void append_post_ops(dnnl::post_ops& ops, const Epilogue& epilogue, const memory::desc& residual_md, bool in_place) {
  for (const PostOp& op : epilogue) {
    if (op.kind == PostOp::Kind::activation && is_gelu(op.activation)) {
      const bool erf = op.activation == Activation::gelu_erf;
      ops.append_eltwise(erf ? dnnl::algorithm::eltwise_gelu_erf : dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
      continue;
    }
    EMBER_CHECK(op.kind == PostOp::Kind::add, RuntimeError, "ember: an activation other than a GELU, or a multiply, ",
                "reached a oneDNN post-op; they run in ember's epilogue (EpilogueSplit)");
    if (in_place) {
      ops.append_sum(1.0f);
    } else {
      ops.append_binary(dnnl::algorithm::binary_add, residual_md);
    }
  }
}

dnnl::primitive_attr make_attr(const Epilogue& epilogue, const memory::desc& residual_md, bool in_place) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  append_post_ops(ops, epilogue, residual_md, in_place);
  attr.set_post_ops(ops);
  return attr;
}

CallArg residual_call_arg(const Epilogue& epilogue, const TensorView* residual, bool in_place) {
  if (residual != nullptr && !in_place) {
    for (size_t i = 0; i < epilogue.size(); ++i) {
      if (epilogue[i].kind == PostOp::Kind::add) {
        return {DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1, residual->data()};
      }
    }
  }
  return {0, nullptr};
}

memory::data_type to_dnnl(DType dtype) {
  switch (dtype) {
    case DType::f32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    case DType::f16: return memory::data_type::f16;
    case DType::i8: return memory::data_type::s8;
    case DType::u8: return memory::data_type::u8;
    case DType::i32: return memory::data_type::s32;
    default: break;
  }
  throw TypeError(detail::concat("oneDNN has no ", dtype_name(dtype), " type"));
}

bool is_compute_dtype(DType compute) noexcept {
  return compute == DType::f32 || compute == DType::bf16 || compute == DType::f16;
}

bool compute_supported(DType compute, std::string (*probe)(DType)) {
  if (!is_compute_dtype(compute)) return false;
  if (compute == DType::f32) return true;
  if (compute == DType::f16 && !cpu_features().avx512_fp16) return false;
  try {
    return probe(compute).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

int64_t epilogue_code(const Epilogue& epilogue) noexcept {
  int64_t code = static_cast<int64_t>(epilogue.size());
  for (const PostOp& op : epilogue) {
    code = code * 32 + (op.kind == PostOp::Kind::add        ? 31
                        : op.kind == PostOp::Kind::multiply ? 30
                                                            : static_cast<int64_t>(op.activation) + 1);
  }
  return code;
}

std::vector<float> bias_to_f32(std::string_view op, const TensorView& bias, int64_t n) {
  EMBER_CHECK(bias.ndim() == 1 && bias.size(0) == n, ValueError, op, ": bias must have shape [", n, "], got ",
              bias.describe());
  EMBER_CHECK(bias.dtype() == DType::f32 || bias.dtype() == DType::bf16, TypeError, op,
              ": bias must be float32 or bfloat16, got ", dtype_name(bias.dtype()));
  std::vector<float> out(static_cast<size_t>(n));
  const auto item = static_cast<int64_t>(dtype_size(bias.dtype()));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = static_cast<const char*>(bias.data()) + i * bias.stride(0) * item;
    if (bias.dtype() == DType::f32) {
      std::memcpy(&out[i], p, sizeof(float));
    } else {
      uint16_t top;
      std::memcpy(&top, p, sizeof top);
      out[i] = bf16::bits_float(bf16::join_bits(top, 0));
    }
  }
  return out;
}

void check_output(std::string_view op, DType compute, const TensorView& x, const TensorView& out,
                  const Epilogue& epilogue, const TensorView* residual, bool in_place) {
  const bool narrow = compute != DType::f32;
  EMBER_CHECK(out.dtype() == compute || (narrow && out.dtype() == DType::f32), TypeError, op, ": out must be ",
              dtype_name(compute), narrow ? " or float32" : "", ", got ", dtype_name(out.dtype()));
  check::no_overlap(op, "out", out, "x", x);
  check_epilogue(op, epilogue);
  const bool wants_residual = has_operand(epilogue);
  EMBER_CHECK(
      wants_residual == (residual != nullptr), ValueError, op, ": residual must be given ",
      wants_residual ? "(the epilogue adds or multiplies by it)" : "only when the epilogue has an add or multiply");
  if (residual != nullptr) {
    check::same_shape(op, "residual", *residual, "out", out);
    EMBER_CHECK(is_compute_dtype(residual->dtype()), TypeError, op,
                ": residual must be float32, bfloat16 or float16, got ", dtype_name(residual->dtype()));
    if (!in_place) check::no_overlap(op, "out", out, "residual", *residual);
  }
}

namespace {

// The dense strides of `t`'s sizes with dimensions laid out in `order` (outermost first), if `t`'s dimensions of
// size > 1 have exactly those strides.
bool dense_in(const TensorView& t, const std::vector<int>& order, memory::dims& strides) {
  strides.assign(static_cast<size_t>(t.ndim()), 0);
  int64_t step = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (t.size(*it) > 1 && t.stride(*it) != step) return false;
    strides[*it] = step;
    step *= std::max<int64_t>(t.size(*it), 1);
  }
  return true;
}

}  // namespace

memory::desc md_of(const TensorView& t) {
  const memory::dims dims(t.sizes(), t.sizes() + t.ndim());
  std::vector<int> row_major(static_cast<size_t>(t.ndim()));
  for (int d = 0; d < t.ndim(); ++d) row_major[d] = d;
  memory::dims strides;
  if (dense_in(t, row_major, strides)) return memory::desc(dims, to_dnnl(t.dtype()), strides);
  if (t.ndim() >= 3) {  // [N, C, spatial...] with C innermost
    std::vector<int> channels_last{0};
    for (int d = 2; d < t.ndim(); ++d) channels_last.push_back(d);
    channels_last.push_back(1);
    if (dense_in(t, channels_last, strides)) return memory::desc(dims, to_dnnl(t.dtype()), strides);
  }
  return memory::desc(dims, to_dnnl(t.dtype()), memory::dims(t.strides(), t.strides() + t.ndim()));
}

memory PackedWeights::pack(const memory& source, const memory::desc& layout) {
  memory copy(layout, engine());
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // execute() supplies it
  const dnnl::reorder::primitive_desc pd(source, copy, attr);
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, source}, {DNNL_ARG_TO, copy}};
  execute(dnnl::reorder(pd), pd, args);
  copies_.push_back(copy);
  return copy;
}

double PackedWeights::magnitude_sum() {
  if (magnitude_sum_) return *magnitude_sum_;
  if (copies_.empty()) return std::nan("");
  const memory& copy = copies_.front();
  const memory::data_type type = copy.get_desc().get_data_type();
  if (type != memory::data_type::f32 && type != memory::data_type::bf16) return std::nan("");
  const DType dtype = type == memory::data_type::f32 ? DType::f32 : DType::bf16;
  const auto count = static_cast<int64_t>(copy.get_desc().get_size() / dtype_size(dtype));
  magnitude_sum_ = ember::magnitude_sum(TensorView(copy.get_data_handle(), dtype, {count}));
  return *magnitude_sum_;
}

bool gelu_in_primitive(const Epilogue& epilogue, const TensorView& x, const TensorView& out, PackedWeights& packed,
                       std::mutex& mutex, const std::vector<float>& bias) {
  if (!fuses_gelu(epilogue, out)) return false;
  double weights;
  {
    std::lock_guard<std::mutex> lock(mutex);
    weights = packed.magnitude_sum();
  }
  double bias_max = 0.0;
  for (float b : bias) {
    if (!std::isfinite(b)) return false;
    bias_max = std::max(bias_max, static_cast<double>(std::fabs(b)));
  }
  // NaN in either factor makes the comparison false.
  return static_cast<double>(max_magnitude(x)) * weights + bias_max < 1.7e38;
}

size_t PackedWeights::bytes() const {
  size_t total = 0;
  for (const memory& copy : copies_) total += copy.get_desc().get_size();
  return total;
}

size_t hash_ints(const int64_t* values, size_t n) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = static_cast<uint64_t>(values[i]);
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<size_t>(h);
}

}  // namespace ember::onednn
