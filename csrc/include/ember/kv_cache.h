// The key/value cache of text generation, paged: each sequence's keys and values live in fixed blocks of
// `block_tokens` tokens, listed in the sequence's block table, so that sequences of different lengths share a batch
// without padding to the longest, a cache grows a block at a time (never by copying what it holds), and sequences
// that share a prefix (beam search's beams after a reorder) share its blocks.
//
// A block holds its tokens for every layer: [layer][keys: head][token][key_dim], then [layer][values: head][token]
// [value_dim] (the layout the decode attention reads: one head's keys of a block, contiguous rows). Blocks come from
// a BlockPool that several caches may draw on (a model's generate calls, one after another): the pool keeps the
// blocks a finished cache gave back, so the next call finds its memory mapped and faulted in already. Blocks are
// reference-counted; a block held by more than one sequence is copied before its first new token is written (copy on
// write), so a shared prefix is never copied whole.
//
// A step of a model's forward writes every layer's new keys and values: begin(counts) reserves room for counts[s]
// new tokens of each sequence s, write(layer, k, v) stores a layer's, and commit() makes them part of the sequences
// (length(s) grows by counts[s]). Attention during the step may read the new tokens (after write) as keys
// [length(s), length(s) + counts[s]) of sequence s: visible_length(s) counts them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ember/tensor_view.h"

namespace ember::kv_cache {

/// The shape of a cache's blocks.
struct Layout {
  int64_t layers = 0;
  int64_t heads = 0;      // key/value heads
  int64_t key_dim = 0;    // features of a key
  int64_t value_dim = 0;  // features of a value
  int64_t block_tokens = 64;
  DType dtype = DType::bf16;  // bf16 or f32

  int64_t element_bytes() const noexcept;
  /// Bytes of one layer's keys (or values) of one head in a block: block_tokens rows.
  int64_t head_key_bytes() const noexcept { return block_tokens * key_dim * element_bytes(); }
  int64_t head_value_bytes() const noexcept { return block_tokens * value_dim * element_bytes(); }
  int64_t layer_bytes() const noexcept { return heads * (head_key_bytes() + head_value_bytes()); }
  /// A block's bytes: every layer's keys and values, rounded up to a cache line.
  int64_t block_bytes() const noexcept { return (layers * layer_bytes() + 63) / 64 * 64; }
  /// Byte offset of layer `layer`'s keys (values) of head `head` in a block.
  int64_t key_offset(int64_t layer, int64_t head) const noexcept {
    return layer * layer_bytes() + head * head_key_bytes();
  }
  int64_t value_offset(int64_t layer, int64_t head) const noexcept {
    return layer * layer_bytes() + heads * head_key_bytes() + head * head_value_bytes();
  }
};

/// Checks a layout (every size >= 1, block_tokens <= 4096, dtype bf16 or f32, a block under 2^40 bytes); throws
/// ValueError or TypeError naming `op`.
void check_layout(const char* op, const Layout& layout);

/// Blocks of one layout, reference-counted, handed out to caches and taken back. Grows in chunks (a block at a time
/// while small, then 1/16 of what it holds, so what it has mapped beyond the blocks in use stays a few percent);
/// keeps every chunk until trim() or its end. Not thread-safe: a cache and its pool are used by one thread at a time.
class BlockPool {
 public:
  explicit BlockPool(const Layout& layout);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const Layout& layout() const noexcept { return layout_; }
  /// Grows the pool until it holds at least `blocks` blocks in all, touching their pages (a generate call that
  /// would have faulted them in on its first tokens finds them ready).
  void reserve(int64_t blocks);
  /// A free block with one reference (the pool grows when none is free).
  int32_t acquire();
  void add_reference(int32_t block);
  /// Drops one reference; the block is free again at none.
  void release(int32_t block);
  char* data(int32_t block) const noexcept { return blocks_[static_cast<size_t>(block)]; }
  int32_t references(int32_t block) const noexcept { return references_[static_cast<size_t>(block)]; }
  int64_t blocks() const noexcept { return static_cast<int64_t>(blocks_.size()); }
  int64_t blocks_in_use() const noexcept { return blocks() - static_cast<int64_t>(free_.size()); }
  /// Bytes the pool has allocated (every chunk).
  int64_t bytes() const noexcept { return blocks() * layout_.block_bytes(); }
  /// Whether `t` shares memory with any block.
  bool overlaps(const TensorView& t) const noexcept;
  /// Frees the trailing chunks none of whose blocks is in use (the others keep their block ids); returns the bytes
  /// freed.
  int64_t trim();

 private:
  void grow(int64_t blocks);

  Layout layout_;
  struct Chunk;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<char*> blocks_;        // block id -> its memory
  std::vector<int32_t> chunk_of_;    // block id -> its chunk's index
  std::vector<int32_t> references_;  // block id -> references (0: free)
  std::vector<int32_t> free_;        // free block ids, taken from the back
};

/// The cache of a batch of sequences, on blocks of a pool (shared with other caches, or its own).
class PagedCache {
 public:
  explicit PagedCache(std::shared_ptr<BlockPool> pool);
  ~PagedCache();
  PagedCache(const PagedCache&) = delete;
  PagedCache& operator=(const PagedCache&) = delete;

  const Layout& layout() const noexcept { return pool_->layout(); }
  const BlockPool& pool() const noexcept { return *pool_; }
  int64_t sequences() const noexcept { return static_cast<int64_t>(sequences_.size()); }
  /// Tokens sequence `s` holds (committed).
  int64_t length(int64_t s) const;
  /// Tokens attention may read of sequence `s` during a step: its length plus the step's new tokens once written.
  int64_t visible_length(int64_t s) const;
  /// The longest sequence's length.
  int64_t max_length() const noexcept;
  /// Blocks this cache holds references to (shared ones once each) and their bytes.
  int64_t blocks_held() const;
  int64_t bytes_held() const { return blocks_held() * layout().block_bytes(); }

  /// Sets the number of sequences: new ones empty, dropped ones' blocks released. Not during a step.
  void set_sequences(int64_t count);
  /// Starts a step of counts[s] new tokens for each sequence (counts.size() == sequences()): reserves their blocks,
  /// copying a shared last block first.
  void begin(const std::vector<int64_t>& counts);
  /// Stores layer `layer`'s keys and values of the step: k [S, T, heads, key_dim] and v [S, T, heads, value_dim]
  /// (any strides, the last of stride 1; the cache's dtype), token t of sequence s kept where keep[s, t] (keep: null
  /// for every token, or bool [S, T]); the kept tokens of each sequence must number counts[s]. Written in order after
  /// the sequence's tokens. Checked before anything is written.
  void write(int64_t layer, const TensorView& k, const TensorView& v, const TensorView* keep);
  /// Ends the step: each sequence's length grows by its count.
  void commit();
  /// Abandons a step (nothing of it was committed): the lengths stay; blocks reserved for it stay held.
  void cancel() noexcept;
  bool in_step() const noexcept { return in_step_; }
  /// Sequence s becomes what sequence rows[s] was (beam search's reorder, a batch selection, a repeat): blocks are
  /// shared, not copied. rows may repeat and may name fewer or more sequences than there are.
  void reorder(const std::vector<int64_t>& rows);
  /// Keeps at most lengths[s] tokens of each sequence s (one length per sequence).
  void truncate(const std::vector<int64_t>& lengths);
  /// Releases every block; no sequences remain.
  void clear();

  /// The block holding token `token` of sequence `s`, for the attention kernels (token < visible_length(s)).
  const char* block_of(int64_t s, int64_t token) const noexcept {
    const auto& blocks = sequences_[static_cast<size_t>(s)].blocks;
    return pool_->data(blocks[static_cast<size_t>(token / layout().block_tokens)]);
  }
  /// Every sequence's block addresses, row s at [s * stride, s * stride + blocks of s), stride the most blocks any
  /// sequence holds: the table the attention kernels read. Made again only after the blocks change (a step's
  /// begin, a reorder, a truncation), so a step's layers all read one table; valid until the cache next changes.
  const std::vector<const char*>& block_table(int64_t* stride) const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
    int64_t pending = 0;  // the step's new tokens
  };
  void release_all(Sequence& seq);

  std::shared_ptr<BlockPool> pool_;
  std::vector<Sequence> sequences_;
  bool in_step_ = false;
  // block_table()'s table, and whether it is the blocks' current one
  mutable std::vector<const char*> table_;
  mutable int64_t table_stride_ = 1;
  mutable bool table_current_ = false;
};

}  // namespace ember::kv_cache
