// Thread placement for ember's runtime (CPU pools, pinned threads, multi-stream inference).
//
// Pinning a thread is more than one sched_setaffinity call. The kernels a thread calls run on helper threads
// too: its OpenMP team (torch's, oneDNN's and ember's own loops) and, with EMBER_THREADING=tbb, a oneTBB arena.
// libgomp creates a thread's team once and each team thread keeps the affinity mask it was created with, so a
// thread re-pinned after its first parallel region would still fan out onto the old cores. pin_thread therefore
// also re-pins every team thread from inside a parallel region of the pool's size, and sets that size as the
// thread's OpenMP thread count and ember's thread budget (both per thread).
#pragma once

#include <memory>
#include <vector>

namespace ember {

/// The CPUs the calling thread may run on, ascending.
std::vector<int> thread_affinity();

/// The CPUs this process was given, ascending: the main thread's mask, never the calling thread's (it may be
/// pinned to a pool). Where the OpenMP runtime binds threads (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set),
/// the CPUs of its places instead: libgomp binds the main thread to its first place as it loads, and from then on
/// the mask names that place alone (with OMP_PROC_BIND=close, ember-run planned a 2-CPU machine as one CPU).
std::vector<int> process_cpus();

/// Restricts the calling thread to `cpus`. Throws ValueError for an empty list, an id outside [0, CPU_SETSIZE),
/// or a set none of whose CPUs this process may use. On a throw the thread's mask is unchanged.
void set_thread_affinity(const std::vector<int>& cpus);

/// The calling thread's OpenMP team, one mask per team thread (index 0 is the calling thread), as a parallel
/// region of `threads` threads finds them. Empty in a build without OpenMP.
std::vector<std::vector<int>> team_affinity(int threads);

class ThreadPin;

/// Pins the calling thread and the threads its kernels run on to `cpus` (an ordered list of distinct CPU ids):
///   - OpenMP thread t of the calling thread's team runs on cpus[t] (t = 0 is the calling thread itself);
///   - the thread's OpenMP thread count (omp_set_num_threads, a per-thread setting) and ember's thread budget
///     become cpus.size(), so torch's, oneDNN's and ember's loops from this thread fill exactly the pool;
///   - ember's oneTBB loops from this thread run in an arena of that size whose workers are confined to `cpus`.
/// Returns what it replaced; pass it to unpin_thread on the same thread to put everything back. Throws ValueError
/// (nothing changed) for an empty list, a repeated id, or CPUs this process may not use.
std::unique_ptr<ThreadPin> pin_thread(const std::vector<int>& cpus);

/// Undoes pin_thread: the calling thread's mask, its team's masks, its thread counts and its arena. Throws
/// ValueError when called from another thread than the one pinned.
void unpin_thread(const ThreadPin& pin);

/// The CPUs the calling thread is pinned to by pin_thread (innermost pin), or empty when it is not pinned.
std::vector<int> pinned_cpus();

class ThreadPin {
 public:
  ~ThreadPin();
  ThreadPin(const ThreadPin&) = delete;
  ThreadPin& operator=(const ThreadPin&) = delete;

  const std::vector<int>& cpus() const { return cpus_; }

 private:
  friend std::unique_ptr<ThreadPin> pin_thread(const std::vector<int>& cpus);
  friend void unpin_thread(const ThreadPin& pin);
  ThreadPin() = default;

  std::vector<int> cpus_;
  unsigned long long owner_ = 0;  // pthread id of the pinned thread
  int previous_budget_ = 0;
  int previous_openmp_threads_ = 0;
  std::vector<int> previous_mask_;
  std::vector<std::vector<int>> previous_team_masks_;
  std::shared_ptr<void> previous_arena_;
  std::vector<int> previous_pinned_;
};

}  // namespace ember
