// The paged key/value cache (ember/kv_cache.h): the block pool, the block tables, and the copies of a step's keys and
// values into their blocks.
#include "ember/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "ember/checked.h"
#include "ember/errors.h"
#include "ember/parallel.h"

namespace ember::kv_cache {
namespace {

constexpr const char* kWrite = "KVCache.write";

// Chunks are page-aligned, so a block's rows start on a cache line and a trimmed chunk goes back to the system whole.
constexpr size_t kChunkAlign = 4096;

// A pool grows a block at a time up to this many blocks, then by a sixteenth of what it holds: what it maps beyond
// the blocks in use stays within ~6% (and 2 blocks) while a long generation grows it thousands of times.
constexpr int64_t kGrowthDivisor = 16;

void check_rows(const TensorView& t, const char* name, int64_t sequences, int64_t tokens, int64_t heads, int64_t dim,
                DType dtype) {
  EMBER_CHECK(t.dtype() == dtype, TypeError, kWrite, ": ", name, " must have the cache's dtype ", dtype_name(dtype),
              ", got ", dtype_name(t.dtype()));
  EMBER_CHECK(t.ndim() == 4 && t.size(0) == sequences && t.size(1) == tokens && t.size(2) == heads && t.size(3) == dim,
              ValueError, kWrite, ": ", name, " must be [sequences, tokens, heads, features] = [", sequences, ", ",
              tokens, ", ", heads, ", ", dim, "], got ", t.describe());
  EMBER_CHECK(dim <= 1 || t.stride(3) == 1, ValueError, kWrite, ": ", name,
              " must have its last dimension of stride 1, got ", t.describe());
}

}  // namespace

int64_t Layout::element_bytes() const noexcept { return static_cast<int64_t>(dtype_size(dtype)); }

void check_layout(const char* op, const Layout& layout) {
  EMBER_CHECK(layout.dtype == DType::bf16 || layout.dtype == DType::f32, TypeError, op,
              ": the cache's dtype must be bfloat16 or float32, got ", dtype_name(layout.dtype));
  EMBER_CHECK(layout.layers >= 1 && layout.heads >= 1 && layout.key_dim >= 1 && layout.value_dim >= 1, ValueError, op,
              ": layers, heads, key_dim and value_dim must be >= 1, got ", layout.layers, ", ", layout.heads, ", ",
              layout.key_dim, ", ", layout.value_dim);
  EMBER_CHECK(layout.block_tokens >= 1 && layout.block_tokens <= 4096, ValueError, op,
              ": block_tokens must be in [1, 4096], got ", layout.block_tokens);
  const int64_t dims = checked::add(op, "key_dim + value_dim", layout.key_dim, layout.value_dim);
  const int64_t bytes = checked::mul(op, "a block's bytes", layout.layers, layout.heads, layout.block_tokens, dims,
                                     layout.element_bytes());
  EMBER_CHECK(bytes < (int64_t{1} << 40), ValueError, op, ": a block of ", bytes, " bytes is too large");
}

// --- BlockPool ------------------------------------------------------------------------------------------------------

struct BlockPool::Chunk {
  struct Free {
    void operator()(char* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<char, Free> memory;
  int64_t first = 0, count = 0;  // its blocks' ids
};

BlockPool::BlockPool(const Layout& layout) : layout_(layout) { check_layout("BlockPool", layout); }

BlockPool::~BlockPool() = default;

void BlockPool::grow(int64_t count) {
  const int64_t block_bytes = layout_.block_bytes();
  EMBER_CHECK(blocks() + count <= std::numeric_limits<int32_t>::max(), RuntimeError,
              "BlockPool: more than 2^31 blocks requested");
  const size_t bytes = static_cast<size_t>(checked::mul("BlockPool", "a chunk's bytes", count, block_bytes));
  const size_t rounded = (bytes + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  auto chunk = std::make_unique<Chunk>();
  chunk->memory.reset(static_cast<char*>(std::aligned_alloc(kChunkAlign, rounded)));
  EMBER_CHECK(chunk->memory != nullptr, RuntimeError, "BlockPool: could not allocate ", rounded, " bytes for ", count,
              " key/value blocks");
  chunk->first = blocks();
  chunk->count = count;
  const auto chunk_index = static_cast<int32_t>(chunks_.size());
  for (int64_t i = 0; i < count; ++i) {
    blocks_.push_back(chunk->memory.get() + i * block_bytes);
    chunk_of_.push_back(chunk_index);
    references_.push_back(0);
  }
  // Free blocks are taken from the back: the chunk's first block first.
  for (int64_t i = count - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(chunk->first + i));
  chunks_.push_back(std::move(chunk));
}

void BlockPool::reserve(int64_t count) {
  EMBER_CHECK(count >= 0, ValueError, "BlockPool.reserve: blocks must be >= 0, got ", count);
  if (count <= blocks()) return;
  grow(count - blocks());
  // Touch every page now (in parallel: faulting in gigabytes is the slow part), not on the first tokens.
  const Chunk& chunk = *chunks_.back();
  const int64_t block_bytes = layout_.block_bytes();
  parallel_for(chunk.count, 1, 1, [&](int64_t, int64_t begin, int64_t end) {
    std::memset(chunk.memory.get() + begin * block_bytes, 0, static_cast<size_t>((end - begin) * block_bytes));
  });
}

bool BlockPool::overlaps(const TensorView& t) const noexcept {
  const int64_t block_bytes = layout_.block_bytes();
  for (const auto& chunk : chunks_) {
    const TensorView memory(chunk->memory.get(), DType::u8, {chunk->count * block_bytes});
    if (t.overlaps(memory)) return true;
  }
  return false;
}

int32_t BlockPool::acquire() {
  if (free_.empty()) grow(std::max<int64_t>(1, blocks() / kGrowthDivisor));
  const int32_t block = free_.back();
  free_.pop_back();
  references_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockPool::add_reference(int32_t block) { ++references_[static_cast<size_t>(block)]; }

void BlockPool::release(int32_t block) {
  int32_t& refs = references_[static_cast<size_t>(block)];
  if (--refs == 0) free_.push_back(block);
}

int64_t BlockPool::trim() {
  std::vector<int64_t> in_use(chunks_.size(), 0);
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (references_[b] > 0) ++in_use[static_cast<size_t>(chunk_of_[b])];
  }
  // Caches hold block ids, so only the trailing chunks with no block in use are freed: every other id stays as it was.
  int64_t freed = 0;
  while (!chunks_.empty() && in_use[chunks_.size() - 1] == 0) {
    const Chunk& last = *chunks_.back();
    freed += last.count * layout_.block_bytes();
    blocks_.resize(static_cast<size_t>(last.first));
    chunk_of_.resize(static_cast<size_t>(last.first));
    references_.resize(static_cast<size_t>(last.first));
    chunks_.pop_back();
  }
  if (freed > 0) {
    const auto end = static_cast<int32_t>(blocks_.size());
    free_.erase(std::remove_if(free_.begin(), free_.end(), [end](int32_t b) { return b >= end; }), free_.end());
  }
  return freed;
}

// --- PagedCache -----------------------------------------------------------------------------------------------------

PagedCache::PagedCache(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {
  EMBER_CHECK(pool_ != nullptr, ValueError, "KVCache: a block pool is required");
}

PagedCache::~PagedCache() { clear(); }

int64_t PagedCache::length(int64_t s) const {
  EMBER_CHECK(s >= 0 && s < sequences(), IndexError, "KVCache.length: sequence ", s, " out of range [0, ", sequences(),
              ")");
  return sequences_[static_cast<size_t>(s)].length;
}

int64_t PagedCache::visible_length(int64_t s) const {
  const Sequence& seq = sequences_[static_cast<size_t>(s)];
  return seq.length + (in_step_ ? seq.pending : 0);
}

int64_t PagedCache::max_length() const noexcept {
  int64_t longest = 0;
  for (const Sequence& seq : sequences_) longest = std::max(longest, seq.length);
  return longest;
}

int64_t PagedCache::blocks_held() const {
  std::vector<int32_t> ids;
  for (const Sequence& seq : sequences_) ids.insert(ids.end(), seq.blocks.begin(), seq.blocks.end());
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

void PagedCache::release_all(Sequence& seq) {
  for (const int32_t block : seq.blocks) pool_->release(block);
  seq.blocks.clear();
  seq.length = 0;
  seq.pending = 0;
}

void PagedCache::set_sequences(int64_t count) {
  table_current_ = false;  // (the blocks change below)
  EMBER_CHECK(!in_step_, RuntimeError, "KVCache: the number of sequences cannot change during a step");
  EMBER_CHECK(count >= 0, ValueError, "KVCache: sequences must be >= 0, got ", count);
  for (int64_t s = count; s < sequences(); ++s) release_all(sequences_[static_cast<size_t>(s)]);
  sequences_.resize(static_cast<size_t>(count));
}

void PagedCache::begin(const std::vector<int64_t>& counts) {
  table_current_ = false;  // (the blocks change below)
  constexpr const char* op = "KVCache.begin";
  EMBER_CHECK(!in_step_, RuntimeError, op, ": a step is already in progress (commit or cancel it first)");
  EMBER_CHECK(static_cast<int64_t>(counts.size()) == sequences(), ValueError, op, ": one count per sequence (",
              sequences(), ") expected, got ", counts.size());
  for (const int64_t c : counts) {
    EMBER_CHECK(c >= 0 && c <= (int64_t{1} << 40), ValueError, op, ": token counts must be in [0, 2^40], got ", c);
  }
  const int64_t tokens_per_block = layout().block_tokens, block_bytes = layout().block_bytes();
  for (size_t s = 0; s < sequences_.size(); ++s) {
    Sequence& seq = sequences_[s];
    seq.pending = counts[s];
    if (counts[s] == 0) continue;
    // Copy on write: the block the new tokens start in, when partly filled and shared with another sequence.
    if (seq.length % tokens_per_block != 0) {
      int32_t& last = seq.blocks.back();
      if (pool_->references(last) > 1) {
        const int32_t copy = pool_->acquire();
        std::memcpy(pool_->data(copy), pool_->data(last), static_cast<size_t>(block_bytes));
        pool_->release(last);
        last = copy;
      }
    }
    const int64_t needed = (seq.length + counts[s] + tokens_per_block - 1) / tokens_per_block;
    while (static_cast<int64_t>(seq.blocks.size()) < needed) seq.blocks.push_back(pool_->acquire());
  }
  in_step_ = true;
}

void PagedCache::write(int64_t layer, const TensorView& k, const TensorView& v, const TensorView* keep) {
  const Layout& l = layout();
  EMBER_CHECK(in_step_, RuntimeError, kWrite, ": no step in progress (begin one first)");
  EMBER_CHECK(layer >= 0 && layer < l.layers, IndexError, kWrite, ": layer ", layer, " out of range [0, ", l.layers,
              ")");
  const int64_t n = sequences();
  EMBER_CHECK(k.ndim() == 4, ValueError, kWrite, ": k must be [sequences, tokens, heads, key_dim], got ", k.describe());
  const int64_t tokens = k.size(1);
  check_rows(k, "k", n, tokens, l.heads, l.key_dim, l.dtype);
  check_rows(v, "v", n, tokens, l.heads, l.value_dim, l.dtype);
  // Each sequence's kept tokens, in order: their count must be the step's.
  std::vector<int64_t> kept_tokens;  // [n][tokens]: the token index of the kept token j, or the kept count first
  std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0);
  if (keep != nullptr) {
    EMBER_CHECK(keep->dtype() == DType::boolean, TypeError, kWrite, ": keep must be bool, got ",
                dtype_name(keep->dtype()));
    EMBER_CHECK(keep->ndim() == 2 && keep->size(0) == n && keep->size(1) == tokens, ValueError, kWrite,
                ": keep must be [sequences, tokens] = [", n, ", ", tokens, "], got ", keep->describe());
    const auto* flags = static_cast<const uint8_t*>(keep->data());
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t t = 0; t < tokens; ++t) {
        if (flags[s * keep->stride(0) + t * keep->stride(1)] != 0) kept_tokens.push_back(t);
      }
      offsets[static_cast<size_t>(s) + 1] = static_cast<int64_t>(kept_tokens.size());
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    const int64_t kept =
        keep != nullptr ? offsets[static_cast<size_t>(s) + 1] - offsets[static_cast<size_t>(s)] : tokens;
    EMBER_CHECK(kept == sequences_[static_cast<size_t>(s)].pending, ValueError, kWrite, ": sequence ", s, " keeps ",
                kept, " tokens where the step began with ", sequences_[static_cast<size_t>(s)].pending);
  }
  for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
    EMBER_CHECK(!pool_->overlaps(*t), ValueError, kWrite, ": ", name, " overlaps the cache's memory");
  }

  // Rows (sequence, kept token j) go to position length + j; each row copies its heads' keys and values.
  const int64_t esize = l.element_bytes();
  const size_t key_row = static_cast<size_t>(l.key_dim * esize), value_row = static_cast<size_t>(l.value_dim * esize);
  const int64_t total = keep != nullptr ? offsets.back() : n * tokens;
  const auto* kd = static_cast<const char*>(k.data());
  const auto* vd = static_cast<const char*>(v.data());
  parallel_for(total, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, l.heads)), 1,
               [&](int64_t, int64_t begin, int64_t end) {
                 int64_t s = 0;
                 for (int64_t row = begin; row < end; ++row) {
                   int64_t j = 0, t = 0;
                   if (keep != nullptr) {
                     while (offsets[static_cast<size_t>(s) + 1] <= row) ++s;
                     j = row - offsets[static_cast<size_t>(s)];
                     t = kept_tokens[static_cast<size_t>(row)];
                   } else {
                     s = row / tokens;
                     j = t = row % tokens;
                   }
                   const Sequence& seq = sequences_[static_cast<size_t>(s)];
                   const int64_t position = seq.length + j;
                   char* block = pool_->data(seq.blocks[static_cast<size_t>(position / l.block_tokens)]);
                   const int64_t in_block = position % l.block_tokens;
                   for (int64_t h = 0; h < l.heads; ++h) {
                     std::memcpy(block + l.key_offset(layer, h) + in_block * static_cast<int64_t>(key_row),
                                 kd + (s * k.stride(0) + t * k.stride(1) + h * k.stride(2)) * esize, key_row);
                     std::memcpy(block + l.value_offset(layer, h) + in_block * static_cast<int64_t>(value_row),
                                 vd + (s * v.stride(0) + t * v.stride(1) + h * v.stride(2)) * esize, value_row);
                   }
                 }
               });
}

void PagedCache::commit() {
  EMBER_CHECK(in_step_, RuntimeError, "KVCache.commit: no step in progress");
  for (Sequence& seq : sequences_) {
    seq.length += seq.pending;
    seq.pending = 0;
  }
  in_step_ = false;
}

void PagedCache::cancel() noexcept {
  for (Sequence& seq : sequences_) seq.pending = 0;
  in_step_ = false;
}

void PagedCache::reorder(const std::vector<int64_t>& rows) {
  table_current_ = false;  // (the blocks change below)
  EMBER_CHECK(!in_step_, RuntimeError, "KVCache.reorder: not during a step");
  for (const int64_t r : rows) {
    EMBER_CHECK(r >= 0 && r < sequences(), IndexError, "KVCache.reorder: row ", r, " out of range [0, ", sequences(),
                ")");
  }
  std::vector<Sequence> next(rows.size());
  for (size_t s = 0; s < rows.size(); ++s) {
    next[s] = sequences_[static_cast<size_t>(rows[s])];
    for (const int32_t block : next[s].blocks) pool_->add_reference(block);
  }
  for (Sequence& seq : sequences_) release_all(seq);
  sequences_ = std::move(next);
}

void PagedCache::truncate(const std::vector<int64_t>& lengths) {
  table_current_ = false;  // (the blocks change below)
  EMBER_CHECK(!in_step_, RuntimeError, "KVCache.truncate: not during a step");
  EMBER_CHECK(static_cast<int64_t>(lengths.size()) == sequences(), ValueError,
              "KVCache.truncate: one length per sequence (", sequences(), ") expected, got ", lengths.size());
  for (const int64_t length : lengths) {
    EMBER_CHECK(length >= 0, ValueError, "KVCache.truncate: lengths must be >= 0, got ", length);
  }
  const int64_t tokens_per_block = layout().block_tokens;
  for (size_t s = 0; s < sequences_.size(); ++s) {
    Sequence& seq = sequences_[s];
    if (seq.length <= lengths[s]) continue;
    seq.length = lengths[s];
    const auto needed = static_cast<size_t>((seq.length + tokens_per_block - 1) / tokens_per_block);
    while (seq.blocks.size() > needed) {
      pool_->release(seq.blocks.back());
      seq.blocks.pop_back();
    }
  }
}

void PagedCache::clear() {
  table_current_ = false;  // (the blocks change below)
  for (Sequence& seq : sequences_) release_all(seq);
  sequences_.clear();
  in_step_ = false;
}

const std::vector<const char*>& PagedCache::block_table(int64_t* stride) const {
  if (!table_current_) {
    size_t widest = 1;
    for (const Sequence& seq : sequences_) widest = std::max(widest, seq.blocks.size());
    table_.assign(sequences_.size() * widest, nullptr);
    for (size_t s = 0; s < sequences_.size(); ++s) {
      for (size_t b = 0; b < sequences_[s].blocks.size(); ++b) {
        table_[s * widest + b] = pool_->data(sequences_[s].blocks[b]);
      }
    }
    table_stride_ = static_cast<int64_t>(widest);
    table_current_ = true;
  }
  *stride = table_stride_;
  return table_;
}

}  // namespace ember::kv_cache
