// Internal seams between affinity.cpp (OS masks, pin_thread), parallel.cpp (budgets, oneTBB arenas) and
// parallel_openmp.cpp (the only file compiled with -fopenmp).
#pragma once

#include <memory>
#include <vector>

namespace ember::detail {

/// sched_setaffinity of the calling thread; returns 0 or the errno.
int set_calling_thread_mask(const std::vector<int>& cpus) noexcept;
/// sched_getaffinity of the calling thread, ascending.
std::vector<int> calling_thread_mask();

/// The calling thread's OpenMP thread count (omp_get_max_threads); 0 without OpenMP.
int openmp_thread_count() noexcept;
/// Sets the calling thread's OpenMP thread count (a per-thread ICV) when it differs; a no-op without OpenMP.
/// oneDNN's OpenMP build sizes its regions by it, and so does torch.
void openmp_set_calling_thread_budget(int threads);
/// Runs a parallel region of masks.size() threads from the calling thread; thread t sets its own mask to
/// masks[t]. Returns false if the region had fewer threads than asked (then no mask was changed) or a mask was
/// refused (masks already set stay set). Without OpenMP: true, nothing done.
bool openmp_set_team_masks(const std::vector<std::vector<int>>& masks);
/// Each team thread's mask, from a parallel region of `threads` threads. Empty without OpenMP.
std::vector<std::vector<int>> openmp_team_masks(int threads);
/// The CPUs of the OpenMP runtime's places, ascending, where it binds threads to them (OMP_PROC_BIND, OMP_PLACES,
/// GOMP_CPU_AFFINITY); empty where it binds none, and without OpenMP.
std::vector<int> openmp_place_cpus();

/// A oneTBB arena of cpus.size() slots whose worker threads run on `cpus` while they work in it.
std::shared_ptr<void> make_confined_arena(const std::vector<int>& cpus);
/// Makes `arena` (from make_confined_arena, or null for the shared arena) the one the calling thread's oneTBB
/// loops run in; returns the previous one.
std::shared_ptr<void> exchange_thread_arena(std::shared_ptr<void> arena);

}  // namespace ember::detail
