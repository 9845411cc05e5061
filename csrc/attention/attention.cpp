// Scaled dot-product attention: argument checks, the operands as strides, the size of a task's query block, and the
// parallel pass over the tasks. The arithmetic lives in attention_body.inl.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

#include "attention_kernels.h"
#include "core/growing_buffer.h"
#include "ember/attention.h"
#include "ember/checked.h"
#include "ember/errors.h"
#include "ember/kv_cache.h"
#include "ember/parallel.h"
#include "ember/trace.h"

namespace ember::attention {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "scaled_dot_product_attention";

constexpr IsaImpl<AttentionFn> kAttention[4] = {{Isa::avx512_bf16, attention_tasks_avx512_bf16},
                                                {Isa::avx512, attention_tasks_avx512},
                                                {Isa::avx2, attention_tasks_avx2},
                                                {Isa::ref, attention_tasks_ref}};
constexpr IsaImpl<FewQueryFn> kFewQueryTasks[4] = {{Isa::avx512_bf16, few_query_tasks_avx512_bf16},
                                                   {Isa::avx512, few_query_tasks_avx512},
                                                   {Isa::avx2, few_query_tasks_avx2},
                                                   {Isa::ref, few_query_tasks_ref}};
constexpr IsaImpl<FewQueryFn> kFewQueryCombine[4] = {{Isa::avx512_bf16, few_query_combine_avx512_bf16},
                                                     {Isa::avx512, few_query_combine_avx512},
                                                     {Isa::avx2, few_query_combine_avx2},
                                                     {Isa::ref, few_query_combine_ref}};

// The query block of a task: 64 rows (the packed block and its scores stay in L2), halved down to 16 while there
// are fewer than two tasks a thread, so that one sequence of a few heads still spreads over the cores.
constexpr int64_t kMaxBlockQ = 64;
constexpr int64_t kMinBlockQ = 16;

void check_operand(std::string_view name, const TensorView& t) {
  EMBER_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, TypeError, kOp, ": ", name,
              " must have dtype float32 or bfloat16, got ", dtype_name(t.dtype()));
  EMBER_CHECK(t.ndim() == 4, ValueError, kOp, ": ", name, " must be 4-D [batch, heads, length, features], got ",
              t.describe());
  EMBER_CHECK(t.size(3) <= 1 || t.stride(3) == 1, ValueError, kOp, ": ", name,
              " must have its last dimension of stride 1, got ", t.describe());
}

template <typename P>
Operand<P> operand_of(const TensorView& t) {
  return Operand<P>{t.data(), t.stride(0), t.stride(1), t.stride(2), t.dtype() == DType::bf16};
}

// The mask's strides over [B, Hq, Lq, Lk], its dimensions aligned from the right, size-1 dimensions broadcast.
void set_mask(const TensorView& mask, const int64_t (&shape)[4], AttentionArgs& a) {
  EMBER_CHECK(mask.dtype() == DType::f32 || mask.dtype() == DType::bf16 || mask.dtype() == DType::boolean, TypeError,
              kOp, ": mask must have dtype float32, bfloat16 or bool, got ", dtype_name(mask.dtype()));
  EMBER_CHECK(mask.ndim() >= 1 && mask.ndim() <= 4, ValueError, kOp,
              ": mask must have 1 to 4 dimensions, broadcasting to [batch, heads, queries, keys] = [", shape[0], ", ",
              shape[1], ", ", shape[2], ", ", shape[3], "], got ", mask.describe());
  int64_t strides[4] = {0, 0, 0, 0};
  const int skip = 4 - mask.ndim();
  for (int d = 0; d < mask.ndim(); ++d) {
    const int64_t size = mask.size(d), target = shape[skip + d];
    EMBER_CHECK(size == target || size == 1, ValueError, kOp, ": mask ", mask.describe(),
                " does not broadcast to [batch, heads, queries, keys] = [", shape[0], ", ", shape[1], ", ", shape[2],
                ", ", shape[3], "]");
    strides[skip + d] = size == 1 ? 0 : mask.stride(d);
  }
  a.mask = mask.data();
  a.mask_kind = mask.dtype() == DType::f32    ? MaskKind::additive_f32
                : mask.dtype() == DType::bf16 ? MaskKind::additive_bf16
                                              : MaskKind::keep_bool;
  a.mask_sb = strides[0];
  a.mask_sh = strides[1];
  a.mask_si = strides[2];
  a.mask_sj = strides[3];
}

// A soft cap is 0 (none) or a finite float32 > 0.
void check_softcap(std::string_view op, double softcap) {
  EMBER_CHECK(softcap == 0.0 || (softcap > 0.0 && std::isfinite(static_cast<float>(softcap))), ValueError, op,
              ": softcap must be 0 (none) or a finite float32 > 0, got ", softcap);
}

// bf16 calls take the tile path where the CPU has AMX (and its use is not capped below it).
bool runs_on_amx(DType dtype) { return dtype == DType::bf16 && active_isa() >= Isa::amx; }

// The scratch of a call that outlives its tasks (the AMX path's packed keys and values, the few-query path's partial
// results), kept by the calling thread for its next call up to kKeptCallBytes: allocated afresh, a call's megabytes
// were mapped and faulted in anew each time (glibc hands large blocks back to the system when they are freed), which
// cost as much as the attention itself for BERT-base's heads at batch 16 on 2 SPR cores. A larger call allocates its
// own (`own`). Not zeroed: the packing and the tasks write every element that is read after them, and zeroing
// megabytes on one thread cost as much as a BERT layer's attention on 16.
constexpr size_t kKeptCallBytes = size_t{64} << 20;

GrowingBuffer& kept_call_buffer() {
  thread_local GrowingBuffer kept;
  return kept;
}

template <typename T>
T* call_buffer(int64_t elements, GrowingBuffer& own) {
  const size_t bytes = static_cast<size_t>(elements) * sizeof(T);
  return static_cast<T*>((bytes > kKeptCallBytes ? own : kept_call_buffer()).get(bytes));
}

// The few-query path: every (batch, key/value head, key chunk) task in parallel, then every output row.
void run_few_queries(const AttentionArgs& a) {
  FewQueryPartials part;
  part.key_end = a.causal ? std::min(a.len_k, a.len_q) : a.len_k;  // (over a cache: its longest sequence's keys)
  part.chunks = (part.key_end + kFewQueryChunk - 1) / kFewQueryChunk;
  part.rows = a.heads_q / a.heads_kv * a.len_q;
  part.ldv = (a.dim_v + 15) / 16 * 16;
  const int64_t groups = a.batch * a.heads_kv;
  const int64_t entries = checked::mul(kOp, "partial results", groups * part.chunks, part.rows);
  const int64_t floats = checked::mul(kOp, "partial results", entries, part.ldv + 2);
  GrowingBuffer own;
  part.o = call_buffer<float>(floats, own);
  part.m = part.o + entries * part.ldv;
  part.l = part.m + entries;
  const Isa isa = active_isa();
  const FewQueryFn tasks = select_impl(kFewQueryTasks, isa).fn, combine = select_impl(kFewQueryCombine, isa).fn;
  parallel_for(groups * part.chunks, 1, 1, [&](int64_t, int64_t begin, int64_t end) { tasks(a, part, begin, end); });
  parallel_for(a.batch * a.heads_q * a.len_q, 1, 1,
               [&](int64_t, int64_t begin, int64_t end) { combine(a, part, begin, end); });
}

// Packs every head's keys and values into tiles (in parallel), then runs the tasks on them.
void run_amx(const AttentionArgs& a, int64_t tasks) {
  PackedKeysValues packed;
  packed.blocks = (a.len_k + kAmxBlockK - 1) / kAmxBlockK;
  packed.key_tiles =
      packed.blocks > 1 ? kAmxKeyTiles : (a.len_k + kAmxKeyGroup - 1) / kAmxKeyGroup * kAmxKeyGroup / kAmxTile;
  packed.dim_steps = (a.dim_qk + kAmxDepth - 1) / kAmxDepth;
  packed.value_tiles = (a.dim_v + kAmxTile - 1) / kAmxTile;
  const int64_t heads = a.batch * a.heads_kv;
  const int64_t key_elements = checked::mul(kOp, "packed keys", heads, packed.key_elements());
  const int64_t value_elements = checked::mul(kOp, "packed values", heads, packed.value_elements());
  GrowingBuffer own;
  packed.keys = call_buffer<uint16_t>(checked::add(kOp, "packed keys and values", key_elements, value_elements), own);
  packed.values = packed.keys + key_elements;
  parallel_for(heads * packed.blocks, 1, 1,
               [&](int64_t, int64_t begin, int64_t end) { pack_keys_values_amx(a, packed, begin, end); });
  parallel_for(tasks, 1, 1, [&](int64_t, int64_t begin, int64_t end) { attention_tasks_amx(a, packed, begin, end); });
}

}  // namespace

Isa implementation() { return active_isa() >= Isa::amx ? Isa::amx : select_impl(kAttention, active_isa()).isa; }

void scaled_dot_product(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* mask,
                        bool causal, double scale, const TensorView& out, double softcap) {
  check_operand("q", q);
  check_operand("k", k);
  check_operand("v", v);
  check_operand("out", out);
  for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"out", &out}}) {
    EMBER_CHECK(t->dtype() == q.dtype(), TypeError, kOp, ": q, k, v and out must share one dtype; q is ",
                dtype_name(q.dtype()), ", ", name, " is ", dtype_name(t->dtype()));
  }
  const int64_t batch = q.size(0), heads_q = q.size(1), len_q = q.size(2), dim_qk = q.size(3);
  const int64_t heads_kv = k.size(1), len_k = k.size(2), dim_v = v.size(3);
  EMBER_CHECK(k.size(0) == batch && v.size(0) == batch, ValueError, kOp, ": q, k and v must have one batch size, got ",
              q.describe(), ", ", k.describe(), ", ", v.describe());
  EMBER_CHECK(k.size(3) == dim_qk, ValueError, kOp, ": q and k must have one feature size, got ", q.describe(), " and ",
              k.describe());
  EMBER_CHECK(v.size(1) == heads_kv && v.size(2) == len_k, ValueError, kOp,
              ": k and v must have the same heads and length, got ", k.describe(), " and ", v.describe());
  EMBER_CHECK(heads_kv >= 1 && heads_q % heads_kv == 0, ValueError, kOp,
              ": the query heads must be a multiple of the key/value heads (grouped-query attention), got ", heads_q,
              " and ", heads_kv);
  EMBER_CHECK(dim_qk >= 1, ValueError, kOp, ": q and k must have at least one feature, got ", q.describe());
  const int64_t out_shape[4] = {batch, heads_q, len_q, dim_v};
  for (int d = 0; d < 4; ++d) {
    EMBER_CHECK(out.size(d) == out_shape[d], ValueError, kOp, ": out must have shape [", batch, ", ", heads_q, ", ",
                len_q, ", ", dim_v, "], got ", out.describe());
  }
  EMBER_CHECK(out.is_dense(), ValueError, kOp,
              ": out must hold each element once (dense, in any order of its dimensions), got ", out.describe());
  EMBER_CHECK(std::isfinite(static_cast<float>(scale)), ValueError, kOp, ": scale must be a finite float32, got ",
              scale);
  check_softcap(kOp, softcap);

  AttentionArgs a;
  if (mask != nullptr) {
    const int64_t shape[4] = {batch, heads_q, len_q, len_k};
    set_mask(*mask, shape, a);
    check::no_overlap(kOp, "out", out, "mask", *mask);
  }
  check::no_overlap(kOp, "out", out, "q", q);
  check::no_overlap(kOp, "out", out, "k", k);
  check::no_overlap(kOp, "out", out, "v", v);
  if (out.numel() == 0) return;

  a.batch = batch;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.len_q = len_q;
  a.len_k = len_k;
  a.dim_qk = dim_qk;
  a.dim_v = dim_v;
  a.q = operand_of<const void>(q);
  a.k = operand_of<const void>(k);
  a.v = operand_of<const void>(v);
  a.out = operand_of<void>(out);
  a.causal = causal;
  a.scale = static_cast<float>(scale);
  a.softcap = static_cast<float>(softcap);

  // A few queries a head take their own path, chosen by the shape alone (so the thread count never changes the
  // arithmetic): the general path would leave most vector lanes, tile rows and threads idle.
  const auto describe = [&] {
    return "b=" + std::to_string(batch) + ",hq=" + std::to_string(heads_q) + ",hkv=" + std::to_string(heads_kv) +
           ",lq=" + std::to_string(len_q) + ",lk=" + std::to_string(len_k) + ",d=" + std::to_string(dim_qk) +
           (causal ? ",causal" : "") + (mask != nullptr ? ",mask" : "") + (softcap > 0 ? ",softcap" : "") + "," +
           std::string(dtype_name(q.dtype()));
  };
  if (len_q <= kFewQueries) {
    const KernelTrace trace(
        kOp, [] { return "few:" + std::string(isa_name(select_impl(kFewQueryTasks, active_isa()).isa)); }, describe);
    run_few_queries(a);
    return;
  }
  const int64_t threads = num_threads();
  const auto tasks_for = [&](int64_t block) { return batch * heads_q * ((len_q + block - 1) / block); };
  a.block_q = kMaxBlockQ;
  while (a.block_q > kMinBlockQ && tasks_for(a.block_q) < 2 * threads) a.block_q /= 2;

  const bool amx = runs_on_amx(q.dtype());
  const auto& impl = select_impl(kAttention, active_isa());
  const KernelTrace trace(kOp, amx ? Isa::amx : impl.isa, describe);
  if (amx) {
    run_amx(a, tasks_for(a.block_q));
    return;
  }
  const AttentionFn fn = impl.fn;
  parallel_for(tasks_for(a.block_q), 1, 1, [&](int64_t, int64_t begin, int64_t end) { fn(a, begin, end); });
}

void over_cache(const TensorView& q, const kv_cache::PagedCache& cache, int64_t layer, const TensorView* key_limits,
                int64_t window, double scale, const TensorView& out, double softcap) {
  constexpr std::string_view op = "attention_over_cache";
  const kv_cache::Layout& layout = cache.layout();
  check_operand("q", q);
  check_operand("out", out);
  EMBER_CHECK(q.dtype() == layout.dtype && out.dtype() == layout.dtype, TypeError, op,
              ": q and out must have the cache's dtype ", dtype_name(layout.dtype), ", got ", dtype_name(q.dtype()),
              " and ", dtype_name(out.dtype()));
  EMBER_CHECK(layer >= 0 && layer < layout.layers, IndexError, op, ": layer ", layer, " out of range [0, ",
              layout.layers, ")");
  const int64_t batch = q.size(0), heads_q = q.size(1), len_q = q.size(2);
  EMBER_CHECK(batch == cache.sequences(), ValueError, op,
              ": q must have one row of the batch per sequence of the cache (", cache.sequences(), "), got ",
              q.describe());
  EMBER_CHECK(q.size(3) == layout.key_dim, ValueError, op, ": q must have the cache's key_dim ", layout.key_dim,
              " features, got ", q.describe());
  EMBER_CHECK(heads_q % layout.heads == 0 && heads_q >= 1, ValueError, op,
              ": the query heads must be a multiple of the cache's key/value heads (", layout.heads, "), got ",
              heads_q);
  const int64_t out_shape[4] = {batch, heads_q, len_q, layout.value_dim};
  for (int d = 0; d < 4; ++d) {
    EMBER_CHECK(out.size(d) == out_shape[d], ValueError, op, ": out must have shape [", batch, ", ", heads_q, ", ",
                len_q, ", ", layout.value_dim, "], got ", out.describe());
  }
  EMBER_CHECK(out.is_dense(), ValueError, op, ": out must hold each element once (dense), got ", out.describe());
  EMBER_CHECK(window >= 0, ValueError, op, ": window must be >= 0 (0: none), got ", window);
  EMBER_CHECK(std::isfinite(static_cast<float>(scale)), ValueError, op, ": scale must be a finite float32, got ",
              scale);
  check_softcap(op, softcap);
  check::no_overlap(op, "out", out, "q", q);
  EMBER_CHECK(!cache.pool().overlaps(q) && !cache.pool().overlaps(out), ValueError, op,
              ": q and out must not lie in the cache's memory");

  if (key_limits != nullptr) {
    EMBER_CHECK(key_limits->dtype() == DType::i64, TypeError, op, ": key_limits must be int64, got ",
                dtype_name(key_limits->dtype()));
    EMBER_CHECK(key_limits->ndim() == 2 && key_limits->size(0) == batch && key_limits->size(1) == len_q, ValueError, op,
                ": key_limits must be [batch, queries] = [", batch, ", ", len_q, "], got ", key_limits->describe());
  }
  // Each query's visible keys: the limits given, or the causal bound of the last len_q keys of its sequence.
  std::vector<int64_t> lengths(static_cast<size_t>(batch)), limits(static_cast<size_t>(batch * len_q));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t visible = cache.visible_length(b);
    lengths[static_cast<size_t>(b)] = visible;
    for (int64_t i = 0; i < len_q; ++i) {
      int64_t limit = visible - len_q + 1 + i;
      if (key_limits != nullptr) {
        limit = key_limits->data_as<const int64_t>()[b * key_limits->stride(0) + i * key_limits->stride(1)];
      }
      EMBER_CHECK(limit >= 0 && limit <= visible, ValueError, op, ": query ", i, " of sequence ", b,
                  " would see keys up to ", limit, " of the ", visible, " its sequence holds");
      limits[static_cast<size_t>(b * len_q + i)] = limit;
    }
  }
  if (out.numel() == 0) return;

  kernels::CacheBlocks blocks;
  const std::vector<const char*>& table = cache.block_table(&blocks.stride);
  blocks.table = table.data();
  blocks.block_tokens = layout.block_tokens;
  blocks.lengths = lengths.data();
  blocks.key_offset = layout.key_offset(layer, 0);
  blocks.key_head_bytes = layout.head_key_bytes();
  blocks.value_offset = layout.value_offset(layer, 0);
  blocks.value_head_bytes = layout.head_value_bytes();

  AttentionArgs a;
  a.batch = batch;
  a.heads_q = heads_q;
  a.heads_kv = layout.heads;
  a.dim_qk = layout.key_dim;
  a.dim_v = layout.value_dim;
  a.len_k = *std::max_element(lengths.begin(), lengths.end());
  a.scale = static_cast<float>(scale);
  a.cache = &blocks;
  a.window = window;
  a.softcap = static_cast<float>(softcap);
  const KernelTrace trace(
      op, [] { return "few:" + std::string(isa_name(select_impl(kFewQueryTasks, active_isa()).isa)); },
      [&] {
        return "b=" + std::to_string(batch) + ",hq=" + std::to_string(heads_q) +
               ",hkv=" + std::to_string(layout.heads) + ",lq=" + std::to_string(len_q) +
               ",lk<=" + std::to_string(a.len_k) + ",d=" + std::to_string(layout.key_dim) +
               (window > 0 ? ",window" : "") + "," + std::string(dtype_name(q.dtype()));
      });
  // Queries in groups of kCachedQueryBlock: each group's scores of a chunk stay in the task's scratch (the few-query
  // path's rows are all of a head group's queries).
  constexpr int64_t kCachedQueryBlock = 16;
  for (int64_t i0 = 0; i0 < len_q; i0 += kCachedQueryBlock) {
    const int64_t n = std::min(kCachedQueryBlock, len_q - i0);
    // The limits of the block's queries, batch-major as the tasks read them.
    std::vector<int64_t> block_limits(static_cast<size_t>(batch * n));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        block_limits[static_cast<size_t>(b * n + i)] = limits[static_cast<size_t>(b * len_q + i0 + i)];
      }
    }
    a.len_q = n;
    a.key_limits = block_limits.data();
    a.q = operand_of<const void>(q);
    a.q.data = static_cast<const char*>(q.data()) + i0 * q.stride(2) * static_cast<int64_t>(dtype_size(q.dtype()));
    a.out = operand_of<void>(out);
    a.out.data = static_cast<char*>(out.data()) + i0 * out.stride(2) * static_cast<int64_t>(dtype_size(out.dtype()));
    run_few_queries(a);
  }
}

}  // namespace ember::attention
