// ember's own parallel loops.
//
// The thread budget is the caller's (the Python layer keeps it equal to torch.get_num_threads()). Work is split
// statically into contiguous chunks, so which element lands in which chunk depends only on the size and the
// thread count, never on timing; kernels built on it give the same result for any thread count as long as each
// element's value does not depend on its chunk (elementwise kernels) or reductions combine chunk results in
// chunk order. See docs/decisions.md, "Threading", for why OpenMP runs these loops by default.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

namespace ember {

enum class ThreadingBackend : uint8_t { tbb, openmp };

std::string_view threading_backend_name(ThreadingBackend backend) noexcept;
/// True when this build has the OpenMP backend (CMake option EMBER_WITH_OPENMP).
bool openmp_available() noexcept;
ThreadingBackend threading_backend() noexcept;
/// Selects the backend for later loops; EMBER_THREADING=tbb|openmp sets the initial one (default: openmp when
/// the build has it). Throws ValueError for
/// openmp in a build without it.
void set_threading_backend(ThreadingBackend backend);

/// The most threads one loop from the calling thread uses. Each thread has its own budget, as each thread has its
/// own OpenMP thread count in torch; a thread that never set one gets its OpenMP thread count (omp_get_max_threads)
/// or, in a build without OpenMP, the number of CPUs this process could use when ember was loaded.
int num_threads() noexcept;
/// Sets the calling thread's budget. Throws ValueError unless n >= 1.
void set_num_threads(int n);

/// Number of chunks parallel_for splits n elements into: min(num_threads(), ceil(n / grain)), at least 1.
int64_t num_chunks(int64_t n, int64_t grain) noexcept;

/// The grain for parallel_for over `rows` rows of `row_elements` elements each (a row is never split): all rows in
/// one chunk, on the calling thread, when there are fewer than `parallel_elements` elements in all (too little work
/// to pay for a fork/join); else chunks of at least `chunk_elements` (and one row) over every thread. The team is
/// the whole budget however many chunks there are (see parallel_openmp.cpp), so a grain that made fewer chunks
/// than threads would only leave threads waiting at the closing barrier: a 128 x 768 LayerNorm ran in 4 chunks of
/// 16 threads under a fixed 32K-element grain.
int64_t row_grain(int64_t rows, int64_t row_elements, int64_t parallel_elements, int64_t chunk_elements) noexcept;

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t chunk, int64_t begin, int64_t end);
void parallel_for_chunks(int64_t n, int64_t grain, int64_t align, void* ctx, ChunkFn fn);
}  // namespace detail

/// Calls body(chunk_index, begin, end) for each chunk of [0, n). Chunk boundaries are multiples of `align`
/// elements (so vector loops stay aligned within a chunk) except the last end; chunks hold at least `grain`
/// elements. With one chunk the body runs on the calling thread. The body must not throw.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, int64_t align, Body&& body) {
  auto trampoline = [](void* ctx, int64_t chunk, int64_t begin, int64_t end) {
    (*static_cast<std::remove_reference_t<Body>*>(ctx))(chunk, begin, end);
  };
  detail::parallel_for_chunks(n, grain, align, const_cast<void*>(static_cast<const void*>(&body)), trampoline);
}

}  // namespace ember
