// The OpenMP backend of parallel_for, kept in its own file so that only it is compiled with -fopenmp.
//
// The team is always the whole thread budget, even when there are fewer chunks than threads (the extra threads
// only meet the closing barrier). torch runs its own regions with the same team size on the same libgomp, and
// libgomp re-docks its pool whenever consecutive regions ask for different sizes: on the 16-core Xeon, a
// 2-chunk region between two 16-thread torch ops cost ~0.5 ms that way (benchmarks/bench_threading.py).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/thread_placement.h"

namespace ember::detail {

void openmp_run_chunks(int64_t chunks, int threads, void* ctx, void (*run)(void*, int64_t)) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads();
    for (int64_t c = omp_get_thread_num(); c < chunks; c += team) run(ctx, c);
  }
}

}  // namespace ember::detail

namespace ember::detail {

// oneDNN's OpenMP build sizes its parallel regions by omp_get_max_threads() of the calling thread, an ICV each
// thread holds on its own: a Python thread other than the one that called torch.set_num_threads still has the
// process default.
void openmp_set_calling_thread_budget(int threads) {
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

}  // namespace ember::detail

namespace ember::detail {

int openmp_thread_count() noexcept { return omp_get_max_threads(); }

// libgomp gives each thread that starts parallel regions its own pool of team threads, reused region after region
// as long as the team size does not grow; a team thread keeps the mask it was created with. So re-pinning the
// team means asking each of its threads, from inside a region of the same size, to move itself.
bool openmp_set_team_masks(const std::vector<std::vector<int>>& masks) {
  const int threads = static_cast<int>(masks.size());
  bool full_team = true;
  int refused = 0;
#pragma omp parallel num_threads(threads) reduction(+ : refused)
  {
#pragma omp single
    full_team = omp_get_num_threads() == threads;
    // The single's implied barrier: every thread sees full_team before deciding.
    if (full_team) refused += set_calling_thread_mask(masks[omp_get_thread_num()]) != 0;
  }
  return full_team && refused == 0;
}

std::vector<std::vector<int>> openmp_team_masks(int threads) {
  std::vector<std::vector<int>> masks(threads);
#pragma omp parallel num_threads(threads)
  masks[omp_get_thread_num()] = calling_thread_mask();
  return masks;
}

// The runtime builds its places from the process's mask as it was when the runtime loaded, before it bound the
// initial thread to the first place; their union is the one record of that mask left.
std::vector<int> openmp_place_cpus() {
  std::vector<int> cpus;
  if (omp_get_proc_bind() == omp_proc_bind_false) return cpus;
  for (int place = 0; place < omp_get_num_places(); ++place) {
    const size_t first = cpus.size();
    cpus.resize(first + static_cast<size_t>(omp_get_place_num_procs(place)));
    omp_get_place_proc_ids(place, cpus.data() + first);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace ember::detail
