#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "ember/errors.h"
#include "ember/parallel.h"

namespace ember {
namespace {

class ScopedThreads {
 public:
  ScopedThreads(int n, ThreadingBackend backend) : threads_(num_threads()), backend_(threading_backend()) {
    set_num_threads(n);
    set_threading_backend(backend);
  }
  ~ScopedThreads() {
    set_num_threads(threads_);
    set_threading_backend(backend_);
  }

 private:
  int threads_;
  ThreadingBackend backend_;
};

std::vector<ThreadingBackend> backends() {
  std::vector<ThreadingBackend> out{ThreadingBackend::tbb};
  if (openmp_available()) out.push_back(ThreadingBackend::openmp);
  return out;
}

TEST(Parallel, EveryIndexOnceInAlignedChunks) {
  for (ThreadingBackend backend : backends()) {
    for (int threads : {1, 2, 3, 7}) {
      ScopedThreads scoped(threads, backend);
      for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{1000}, int64_t{100003}}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int64_t> chunks_seen{0};
        parallel_for(n, /*grain=*/16, /*align=*/64, [&](int64_t chunk, int64_t begin, int64_t end) {
          EXPECT_LE(begin, end);
          if (begin != 0) {
            EXPECT_EQ(begin % 64, 0) << "chunk " << chunk;
          }
          for (int64_t i = begin; i < end; ++i) hits[i]++;
          chunks_seen++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
        EXPECT_EQ(chunks_seen.load(), num_chunks(n, 16));
      }
    }
  }
}

TEST(Parallel, ChunkCountFollowsBudgetAndGrain) {
  ScopedThreads scoped(4, ThreadingBackend::tbb);
  EXPECT_EQ(num_chunks(0, 10), 1);
  EXPECT_EQ(num_chunks(10, 10), 1);
  EXPECT_EQ(num_chunks(11, 10), 2);
  EXPECT_EQ(num_chunks(1000, 10), 4);
  EXPECT_EQ(num_chunks(1000, 0), 4);
}

TEST(Parallel, RowGrainKeepsSmallWorkInlineAndSpreadsTheRest) {
  ScopedThreads scoped(16, ThreadingBackend::tbb);
  // Under 32K elements in all: one chunk (the caller's thread).
  EXPECT_EQ(row_grain(8, 768, 1 << 15, 1 << 11), 8);
  EXPECT_EQ(num_chunks(8, row_grain(8, 768, 1 << 15, 1 << 11)), 1);
  EXPECT_EQ(row_grain(0, 768, 1 << 15, 1 << 11), 1);
  // A 128 x 768 LayerNorm: two rows a chunk, so every one of 16 threads gets rows (a fixed 32K grain made 4 chunks).
  EXPECT_EQ(row_grain(128, 768, 1 << 15, 1 << 11), 2);
  EXPECT_EQ(num_chunks(128, row_grain(128, 768, 1 << 15, 1 << 11)), 16);
  // Rows wider than a chunk: one row each at least; a row of no elements counts as one.
  EXPECT_EQ(row_grain(64, 1 << 14, 1 << 15, 1 << 11), 1);
  EXPECT_EQ(row_grain(1 << 20, 0, 1 << 15, 1 << 11), 1 << 11);
  // Sizes whose product would overflow int64: spread, not kept inline.
  EXPECT_EQ(row_grain(int64_t{1} << 40, int64_t{1} << 40, 1 << 15, 1 << 11), 1);
}

TEST(Parallel, SameChunksForSameInputs) {
  // Static partitioning: the split of [0, n) depends only on n and the thread count.
  for (ThreadingBackend backend : backends()) {
    ScopedThreads scoped(3, backend);
    std::vector<int64_t> first(3, -1), second(3, -1);
    parallel_for(10000, 1, 64, [&](int64_t c, int64_t b, int64_t) { first[c] = b; });
    parallel_for(10000, 1, 64, [&](int64_t c, int64_t b, int64_t) { second[c] = b; });
    EXPECT_EQ(first, second);
  }
}

TEST(Parallel, RejectsBadSettings) {
  EXPECT_THROW(set_num_threads(0), ValueError);
  EXPECT_THROW(set_num_threads(-3), ValueError);
  if (!openmp_available()) {
    EXPECT_THROW(set_threading_backend(ThreadingBackend::openmp), ValueError);
  }
}

}  // namespace
}  // namespace ember
