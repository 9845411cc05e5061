// What every oneDNN layer of ember shares: the engine, a stream and a scratchpad per calling thread, the thread
// budget, dtype and post-op translation, and a bounded cache of primitives keyed by shape.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/errors.h"

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember::onednn {

using dnnl::memory;

/// The process's CPU engine.
const dnnl::engine& engine();

/// Makes the calling thread run oneDNN with ember's thread budget (num_threads(), kept equal to torch's by the
/// Python layer) and returns it. Call before creating or executing a primitive: oneDNN sizes both by it.
int use_thread_budget();

/// Executes `prim` on the calling thread's stream with a scratchpad of the calling thread (primitives are created
/// with scratchpad_mode::user, so one primitive can run on several threads at once), and waits.
void execute(const dnnl::primitive& prim, const dnnl::primitive_desc_base& pd, std::unordered_map<int, memory>& args);

/// One argument of a call: its slot (DNNL_ARG_*) and the buffer it reads or writes; a null buffer leaves the slot
/// out (an optional argument, as the bias or a residual).
struct CallArg {
  int slot;
  const void* data;
};

/// A cached primitive with the memory objects of its arguments, made on its first call and pointed at each later
/// call's buffers (set_data_handle). Made afresh on every call they cost a few allocations each (the descriptor's
/// query and clone, the object, its storage, the argument map's nodes): at a few rows of a matmul, more than the
/// arithmetic. The kept set serves one call at a time; a call that finds it in use on another thread makes a set
/// of its own, so a primitive still runs on several threads at once.
class BoundPrimitive {
 public:
  BoundPrimitive(dnnl::primitive prim, const dnnl::primitive_desc_base& pd);
  BoundPrimitive(const BoundPrimitive&) = delete;
  BoundPrimitive& operator=(const BoundPrimitive&) = delete;

  /// Executes with each of `args` (described as the primitive's descriptor says for its slot) and each of `fixed`
  /// (memory objects the caller keeps, as packed weights; an empty one leaves its slot out), on the calling
  /// thread's stream with its scratchpad, and waits.
  void execute(std::initializer_list<CallArg> args, std::initializer_list<std::pair<int, memory>> fixed = {}) const;

 private:
  static constexpr size_t kMaxArgs = 8;

  const memory& point(int slot, const void* data) const;  // the kept memory of `slot`, set to `data`

  dnnl::primitive prim_;
  dnnl::primitive_desc_base pd_;
  memory::desc scratchpad_md_;
  size_t scratchpad_bytes_;
  mutable std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  mutable std::vector<std::pair<int, memory>> kept_;  // by slot; touched only by the call holding busy_
};

/// One call's epilogue, split where oneDNN stops: oneDNN adds the bias and a residual that comes first, and ember's
/// epilogue (epilogue::finish_from) runs the activations, a multiply, and whatever follows them. (A multiply stays
/// in ember's epilogue so that every matmul path, the transposed one included, has one meaning for the operand.)
/// oneDNN's activations disagree with torch on special values, differently per ISA and implementation: its JIT
/// computes ReLU, ReLU6 and Hardsigmoid with max/min, which turn a NaN into 0 or a bound (a diverged layer would
/// read as zeros); its reference post-ops (behind its gemm convolution) compute ReLU(-inf) as -inf·0 = NaN. ember's
/// epilogue is tested against float64 over the whole float range, specials included, at every ISA level
/// (tests/cpp/test_epilogue_rows.cpp). The price is one pass over the output, usually still in cache, in place
/// (measured in docs/reliability.md). A bf16 output's activations start from the rounded values the primitive
/// stored, as under torch's autocast, where a Linear returns bf16 before its GELU.
///
/// One exception (fuses_gelu): a GELU (erf or tanh) that starts the epilogue of a bf16 output runs in the primitive,
/// where the caller has shown that no sum can leave the finite floats (a bound from the input's largest magnitude
/// and the weights'). oneDNN computes the erf GELU as torch 2.x's vectorized F.gelu does (0.5·x·(1 + erf(x/√2)), erf
/// by Abramowitz and Stegun's 7.1.26), on the float32 sum before it is rounded; only its tail below x = -4
/// (|GELU| < 1.3e-4) differs from ember's epilogue, cancelling to tens of percent relative error as torch's does
/// where ember's stays exact. Its tanh GELU does not cancel: within bf16's rounding of float64 from -10 to 1e37
/// (torch's own is 30% off at -5). The specials that differ (+inf gives NaN there) never reach it: an input with an
/// infinity or a NaN, or large enough to overflow a sum, takes the pass. In exchange the pass over the output goes:
/// on the 16-core Xeon the erf GELU of Whisper's 1500 x 1536 FC1 output cost 65-96 us in the primitive against
/// 170-237 us as a pass, ViT-B/16's at batch 16 (3152 x 3072) 407-528 against 754-756 (2-core Zen 5: 199-204
/// against 376-378; the tanh GELU of Whisper's shape 371 against 520).
bool fuses_gelu(const Epilogue& epilogue, const TensorView& out) noexcept;

/// Whether a primitive adds the residual: the epilogue starts with an add (what an EpilogueSplit leaves to the
/// primitive is that add at most, or a fuses_gelu GELU, never another activation or a multiply)
/// of a residual the primitive reads at speed (primitive_reads).
bool primitive_adds(const Epilogue& epilogue, const TensorView* residual) noexcept;

/// Whether oneDNN's own kernels read `residual` in a binary post-op. oneDNN 3.2 reads a bf16 or f16 operand there
/// only on AVX-512 and up; below it the whole primitive falls to its reference implementation (a 128x768x768 fp32
/// Linear adding a bf16 residual took 1.4 s on a Zen 3, 1 ms without the add): there ember's epilogue adds such a
/// residual after the primitive.
bool primitive_reads(const TensorView& residual) noexcept;

class EpilogueSplit {
 public:
  /// Keeps references to its arguments: they must outlive the split. `gelu_in_primitive`: the epilogue's leading
  /// GELU runs in the primitive, and the rest after it (onednn::gelu_in_primitive says where it may).
  EpilogueSplit(const Epilogue& epilogue, const TensorView* residual, const TensorView& out,
                bool gelu_in_primitive = false);
  EpilogueSplit(const EpilogueSplit&) = delete;
  EpilogueSplit& operator=(const EpilogueSplit&) = delete;

  /// The post-ops the primitive runs: the epilogue's leading add, if any, or its leading GELU (gelu_in_primitive).
  const Epilogue& post_ops() const noexcept { return split_ ? head_ : whole_; }
  /// The residual when post_ops() adds it, else null.
  const TensorView* post_ops_residual() const noexcept { return has_operand(post_ops()) ? residual_ : nullptr; }
  /// Runs the rest of the epilogue over `out`, in place, after the primitive has written it.
  void finish() const;
  /// For EMBER_VERBOSE: the post-ops the primitive runs (with its operand's dtype, or "sum" where it accumulates in
  /// place) and those finish() runs after it, as ",fused=add(float32),after=relu"; "" for none.
  std::string describe() const;

 private:
  const Epilogue& whole_;
  const TensorView* residual_;
  const TensorView& out_;
  bool split_ = false;
  Epilogue head_, tail_;  // filled only when split_
};

/// Whether the call adds its residual in place: the epilogue starts with the add, and `residual` is `out` itself (the
/// same memory, dtype, sizes and strides). The primitive then accumulates into the residual it reads (oneDNN's sum
/// post-op), where otherwise it reads the residual as a second tensor (its binary post-op). oneDNN 3.2's binary
/// add cost ResNet-50's sixteen residual convolutions twice what the sum does (bf16, batch 16, 2 SPR cores: 34 ms
/// against 17.7 in IPEX's oneDNN with sum), and a fresh output is memory the allocator must find and the CPU fault in.
bool accumulates_in_place(const Epilogue& epilogue, const TensorView* residual, const TensorView& out) noexcept;

/// Appends the epilogue's add to `ops`: a sum post-op (accumulating into the output) where `in_place`, else a binary
/// post-op reading a tensor of `residual_md`; and a GELU (erf or tanh) as oneDNN's. No other activation reaches oneDNN
/// (EpilogueSplit says why): RuntimeError for one.
void append_post_ops(dnnl::post_ops& ops, const Epilogue& epilogue, const memory::desc& residual_md,
                     bool in_place = false);

/// Attributes every ember primitive starts from: user scratchpad, and the epilogue's add (all of an
/// EpilogueSplit's post_ops there can be) as a post-op (see append_post_ops).
dnnl::primitive_attr make_attr(const Epilogue& epilogue, const memory::desc& residual_md, bool in_place = false);
/// The call argument of the epilogue's add operand (its post-op's slot): `residual`, or none when it is null or
/// the add is in place (the sum post-op reads the output).
CallArg residual_call_arg(const Epilogue& epilogue, const TensorView* residual, bool in_place = false);

memory::data_type to_dnnl(DType dtype);

/// Whether ember's oneDNN layers take `compute` as their compute dtype: float32, bfloat16 or float16.
bool is_compute_dtype(DType compute) noexcept;

/// Whether a layer may compute in `compute` on this CPU: oneDNN builds `probe` (a primitive descriptor of that
/// dtype's implementation name; dnnl::error when it has none) with an implementation of its own ISA. float16 further
/// needs AVX512-FP16 (AMX-FP16 CPUs have it): elsewhere oneDNN's f16 primitives are its reference code or convert
/// through f32 at a fraction of fp32's speed, and ember refuses the dtype rather than run it.
bool compute_supported(DType compute, std::string (*probe)(DType));

/// The epilogue as one integer, for cache keys (5 bits per post-op).
int64_t epilogue_code(const Epilogue& epilogue) noexcept;

/// A bias vector (f32 or bf16, any stride) of `n` entries, in fp32. Throws ValueError / TypeError naming `op`.
std::vector<float> bias_to_f32(std::string_view op, const TensorView& bias, int64_t n);

/// The checks every layer's forward shares: `out` of the compute dtype (or f32 for bf16 compute); the epilogue
/// well formed; `residual` given exactly when it adds, of out's shape, f32 or bf16; out overlapping neither x nor
/// residual, unless `in_place`: the layer adds a residual that is out itself (the caller found
/// accumulates_in_place, and its primitive takes it).
void check_output(std::string_view op, DType compute, const TensorView& x, const TensorView& out,
                  const Epilogue& epilogue, const TensorView* residual, bool in_place = false);

/// Dense strides for `sizes` (of `like`'s rank) that order the dimensions the way `like`'s strides do: a
/// channels-last view gives channels-last strides; ties (size-1 dimensions) keep row-major order.
std::vector<int64_t> strides_like(const TensorView& like, const int64_t* sizes);

/// A plain memory descriptor of a view with its strides. The stride of a size-1 dimension addresses nothing and
/// callers set it as they please (torch 1.13's DLPack export gives 1); oneDNN, though, recognizes a layout only by
/// exact strides and runs its reference code on one it does not know. So a view dense in row-major or
/// channels-last order (its other dimensions) gets the strides that order has, size-1 dimensions included.
memory::desc md_of(const TensorView& t);

/// A cache of at most `capacity` entries, dropping the least recently used. Not synchronized: the owner locks.
template <typename Key, typename Value, typename Hash>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  Value* find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  Value& insert(const Key& key, Value value) {
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  size_t size() const noexcept { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<Key, Value>> order_;
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator, Hash> index_;
};

/// The reordered copies of one layer's weights, one per layout its primitives asked for (usually one). The first
/// copy is made from the caller's weights; a later layout is reordered from the first copy, so a layer never needs
/// the caller's weights after construction. Not synchronized: the owner locks.
class PackedWeights {
 public:
  /// The weights for a primitive whose descriptor `pd` was made with weights format `any`: a copy already in the
  /// layout it asks for; else a copy that `relayout(md)` (the descriptor made again with weights `md`; throws
  /// RuntimeError when no implementation takes them) runs with the same implementation, and `pd` becomes that
  /// descriptor; else a new copy reordered from `source`, or from the first copy when `source` is null.
  template <typename PD, typename Relayout>
  memory select(PD& pd, Relayout&& relayout, const memory* source) {
    const memory::desc wanted = pd.query_md(dnnl::query::weights_md, 0);
    for (const memory& copy : copies_) {
      if (copy.get_desc() == wanted) return copy;
    }
    for (const memory& copy : copies_) {
      try {
        PD same = relayout(copy.get_desc());
        if (same.impl_info_str() == pd.impl_info_str()) {
          pd = std::move(same);
          return copy;
        }
      } catch (const RuntimeError&) {  // NOLINT(bugprone-empty-catch): no implementation takes that layout; try
                                       // the next copy, then pack a new one
      }
    }
    EMBER_CHECK(source != nullptr || !copies_.empty(), ValueError, "PackedWeights: nothing to pack from");
    return pack(source != nullptr ? *source : copies_.front(), wanted);
  }

  /// Reorders `source` (the logical weights, any layout) into a new copy of layout `layout` and keeps it.
  memory pack(const memory& source, const memory::desc& layout);

  /// The sum of the weights' magnitudes (core/magnitude.h), read from the first copy (a layout's padding is zeros)
  /// at the first request and kept: NaN with no copy or where the copy's dtype is neither float32 nor bfloat16.
  double magnitude_sum();

  /// Bytes held by all copies.
  size_t bytes() const;

 private:
  std::vector<memory> copies_;
  std::optional<double> magnitude_sum_;
};

/// Whether a call of a layer on `x` runs its epilogue's leading GELU in the primitive: fuses_gelu, and no sum can
/// reach half of FLT_MAX, each being at most x's largest magnitude times the weights' magnitude sum (each weight
/// enters a sum once at most) plus the bias's largest; false where any of them is not finite. `packed` is the
/// layer's packed weights and `mutex` the lock that guards them (its magnitude sum is read once, at the first such
/// call).
bool gelu_in_primitive(const Epilogue& epilogue, const TensorView& x, const TensorView& out, PackedWeights& packed,
                       std::mutex& mutex, const std::vector<float>& bias);

/// Hash of a sequence of integers (FNV-1a over their bytes), for cache keys.
size_t hash_ints(const int64_t* values, size_t n) noexcept;

}  // namespace ember::onednn
