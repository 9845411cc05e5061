// A working buffer that grows to the largest size asked of it and stays, for kernels that need memory of their own
// on every call (oneDNN's scratchpads, a swapped matmul's transposed output, attention's packed keys and values).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace ember {

/// A buffer that grows to the largest size asked of it and stays (page-aligned). One per calling thread serves
/// as that thread's working memory: one model's calls ask for similar sizes, and a fresh allocation per call cost
/// more than some small matmuls (and, for megabytes, page faults on every call). Not synchronized; not zeroed.
class GrowingBuffer {
 public:
  /// At least `bytes` bytes; the contents are not kept when it grows. Throws RuntimeError when allocation fails.
  void* get(size_t bytes);

 private:
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<void, Free> buffer_;
  size_t capacity_ = 0;
};

}  // namespace ember
