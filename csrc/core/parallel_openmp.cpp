// The OpenMP backend of parallel_for, kept in its own file so that only it is compiled with -fopenmp.
#include <cstdint>

namespace ember::detail {

void openmp_run_chunks(int64_t chunks, void* ctx, void (*run)(void*, int64_t)) {
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) run(ctx, c);
}

}  // namespace ember::detail
