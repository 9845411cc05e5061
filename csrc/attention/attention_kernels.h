// Per-ISA bodies of ember/attention.h: a range of tasks, each one block of query rows of one (batch, head), run
// through every block of keys with the running-softmax rescaling. attention.cpp checks the arguments, sizes the
// blocks and shares the tasks out; attention_body.inl holds the arithmetic.
#pragma once

#include <cstdint>

namespace ember::attention::kernels {

// One [B, H, L, E] operand: element (b, h, l, e) at data + b*sb + h*sh + l*sl + e (elements of its dtype).
template <typename P>
struct Operand {
  P* data = nullptr;
  int64_t sb = 0, sh = 0, sl = 0;
  bool bf16 = false;
};

enum class MaskKind : uint8_t { none, additive_f32, additive_bf16, keep_bool };

// Keys and values read from a paged cache (ember/kv_cache.h) in place of the k and v operands: key j of sequence b
// lies in block table[b * stride + j / block_tokens], row j % block_tokens of head g's keys at byte key_offset +
// g * key_head_bytes of the block (values alike).
struct CacheBlocks {
  const char* const* table = nullptr;
  int64_t stride = 0;
  int64_t block_tokens = 0;
  const int64_t* lengths = nullptr;  // [B]: the keys each sequence holds
  int64_t key_offset = 0, key_head_bytes = 0;
  int64_t value_offset = 0, value_head_bytes = 0;
};

struct AttentionArgs {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, len_q = 0, len_k = 0, dim_qk = 0, dim_v = 0;
  Operand<const void> q, k, v;
  Operand<void> out;
  // Element (b, h, i, j) at mask + b*sb + h*sh + i*si + j*sj; broadcast dimensions have stride 0.
  const void* mask = nullptr;
  MaskKind mask_kind = MaskKind::none;
  int64_t mask_sb = 0, mask_sh = 0, mask_si = 0, mask_sj = 0;
  bool causal = false;
  float scale = 1.0f;
  // > 0: each scaled score passes through softcap · tanh(score / softcap) before the mask is added (Gemma 2's
  // attention-logit soft cap); 0: none.
  float softcap = 0.0f;
  int64_t block_q = 0;  // query rows a task takes; tasks are (b, h, block) in that order
  // The few-query path's extensions (attention over a cache): keys from the cache's blocks; query (b, i) seeing keys
  // [key_limits[b * len_q + i] - window, key_limits[...]) (window 0: from key 0) in place of the causal bound.
  const CacheBlocks* cache = nullptr;
  const int64_t* key_limits = nullptr;
  int64_t window = 0;
};

// The key block is fixed (not the query block, which attention.cpp sizes to the thread count): it sets the order
// of a row's sums, which must not depend on the thread count.
constexpr int64_t kBlockK = 64;

using AttentionFn = void (*)(const AttentionArgs& a, int64_t task_begin, int64_t task_end);
void attention_tasks_ref(const AttentionArgs& a, int64_t task_begin, int64_t task_end);
void attention_tasks_avx2(const AttentionArgs& a, int64_t task_begin, int64_t task_end);
void attention_tasks_avx512(const AttentionArgs& a, int64_t task_begin, int64_t task_end);
// float32 as attention_tasks_avx512; bfloat16 with both products on vdpbf16ps (attention_pairs_body.inl).
void attention_tasks_avx512_bf16(const AttentionArgs& a, int64_t task_begin, int64_t task_end);

// The few-query path (attention_few_queries_body.inl), for calls of at most kFewQueries queries a head, whatever the
// dtype and ISA: a task is one (batch, key/value head, chunk of kFewQueryChunk keys) with every query row of the
// head group, and leaves the chunk's partial result; few_query_combine merges each row's chunks in chunk order. The
// chunks are fixed by the key count alone, so the result does not depend on the thread count.
inline constexpr int64_t kFewQueries = 4;
inline constexpr int64_t kFewQueryChunk = 256;

struct FewQueryPartials {
  float* o = nullptr;   // [B·Hkv][chunks][rows][ldv]: each chunk's outputs, not yet divided by its sum
  float* m = nullptr;   // [B·Hkv][chunks][rows]: the chunk's maximum score of each row
  float* l = nullptr;   // [B·Hkv][chunks][rows]: its sum of e^(score - maximum)
  int64_t chunks = 0;   // ceil(key_end / kFewQueryChunk)
  int64_t key_end = 0;  // keys any query sees: len_k, or under the causal mask at most len_q
  int64_t rows = 0;     // a head group's query rows, (heads_q / heads_kv) · len_q, head-major
  int64_t ldv = 0;      // floats of a partial output row: dim_v rounded up to 16
};

using FewQueryFn = void (*)(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
/// Tasks [begin, end) of the (batch, key/value head, chunk) list.
void few_query_tasks_ref(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_tasks_avx2(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_tasks_avx512(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_tasks_avx512_bf16(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
/// Output rows [begin, end) of the (batch, query head, query) list, from the tasks' partial results.
void few_query_combine_ref(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_combine_avx2(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_combine_avx512(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);
void few_query_combine_avx512_bf16(const AttentionArgs& a, const FewQueryPartials& part, int64_t begin, int64_t end);

// The AMX path (bf16; attention_amx.cpp). Keys and values are first packed, once a call, into the tiles the tile
// multiplies read (a key tile: 16 pairs of features by 16 keys, each pair one 32-bit word, i.e. K transposed in
// words; a value tile: 16 pairs of keys by 16 features, the pair's two values side by side), so that every query
// block of a head reads them ready: packing per query block cost more than its tile multiplies.
inline constexpr int64_t kAmxTile = 16;           // rows of a tile; keys or features of a B or C tile
inline constexpr int64_t kAmxDepth = 32;          // bf16 elements of a tile row
inline constexpr int64_t kAmxTileElements = 512;  // bf16 elements of a 1 KB tile
// The AMX path's key block: four times the vector paths'. Each block costs a query row its fixed steps (the maximum
// and the sum across the row's lanes, the rescale of its sums, the sums' tiles loaded and stored); with 64 keys
// these took most of the time (BERT-base's heads at batch 16, 2 SPR cores: 2.75 ms against torch's 1.75). A row's
// scores for a block live in L1 (rows x 256 floats, 64 KB at 64 rows); a block shorter than this (the last, or
// one that a causal row ends in) computes only the 64-key groups it holds.
inline constexpr int64_t kAmxBlockK = 256;
inline constexpr int64_t kAmxKeyGroup = 64;                     // keys of one pass of the four sum tiles
inline constexpr int64_t kAmxKeyTiles = kAmxBlockK / kAmxTile;  // key tiles in a block of keys

struct PackedKeysValues {
  uint16_t* keys = nullptr;    // [B·Hkv][blocks][dim_steps][key_tiles] tiles
  uint16_t* values = nullptr;  // [B·Hkv][blocks][key_tiles / 2][value_tiles] tiles
  int64_t blocks = 0;          // blocks of kAmxBlockK keys
  // Key tiles a block holds room for: kAmxKeyTiles, or, where every key fits one block, the keys' 64-key groups.
  // Packed at the full block, the heads of Swin's 49-key windows lay 16 KB of keys and 16 KB of values apart, with
  // 4 KB of each read: at batch 16 (3072 heads) 100 MB to map and fault in each call, and 1.9x the AVX512-BF16
  // path's time on the Xeon.
  int64_t key_tiles = 0;
  int64_t dim_steps = 0;                                 // ceil(E / kAmxDepth)
  int64_t value_tiles = 0;                               // ceil(Ev / kAmxTile)
  int64_t value_steps() const { return key_tiles / 2; }  // value tiles down a block of keys: kAmxDepth keys each
  int64_t block_key_elements() const { return dim_steps * key_tiles * kAmxTileElements; }
  int64_t block_value_elements() const { return value_steps() * value_tiles * kAmxTileElements; }
  int64_t key_elements() const { return blocks * block_key_elements(); }      // a head's
  int64_t value_elements() const { return blocks * block_value_elements(); }  // a head's
};

/// Packs blocks [begin, end) of the (batch, key/value head, block) list.
void pack_keys_values_amx(const AttentionArgs& a, const PackedKeysValues& packed, int64_t begin, int64_t end);
/// The tasks [task_begin, task_end) as attention_tasks_*, reading the packed keys and values.
void attention_tasks_amx(const AttentionArgs& a, const PackedKeysValues& packed, int64_t task_begin, int64_t task_end);

}  // namespace ember::attention::kernels
