#include "ember/parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include "core/thread_placement.h"
#include "ember/errors.h"

namespace ember {

namespace detail {
// Defined in parallel_openmp.cpp when the build has OpenMP.
void openmp_run_chunks(int64_t chunks, int threads, void* ctx, void (*run)(void*, int64_t));
}  // namespace detail

namespace {

int cpus_allowed() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
}

// OpenMP by default: it is the runtime torch (and the oneDNN build ember uses) already run on, so ember's loops
// share their thread team instead of handing the cores back and forth between two pools (docs/decisions.md,
// "Threading", has the numbers). EMBER_THREADING=tbb selects oneTBB.
ThreadingBackend backend_from_env() noexcept {
  const char* env = std::getenv("EMBER_THREADING");
  if (env != nullptr && std::strcmp(env, "tbb") == 0) return ThreadingBackend::tbb;
  return openmp_available() ? ThreadingBackend::openmp : ThreadingBackend::tbb;
}

// Each thread's budget mirrors torch's per-thread OpenMP thread count (the Python layer syncs it), so threads
// pinned to pools of different sizes do not fight over one value. A thread that never set its own takes its
// OpenMP thread count where the build has OpenMP, which is torch's value for that thread. (Not the CPUs in the
// affinity mask: GNU OpenMP binds the main thread to one CPU under OMP_PROC_BIND, and oneDNN calls would then
// set that thread's OpenMP count, torch's too, to 1.)
const int g_default_threads = cpus_allowed();
thread_local int t_num_threads = 0;  // 0: the default
std::atomic<ThreadingBackend> g_backend{backend_from_env()};

// One arena of num_threads() slots, rebuilt when the budget changes. Loops hold a shared_ptr to the arena they
// started in, so a concurrent set_num_threads never pulls an arena from under a running loop.
std::mutex g_arena_mutex;
std::shared_ptr<tbb::task_arena> g_arena;

std::shared_ptr<tbb::task_arena> arena_for(int threads) {
  std::lock_guard<std::mutex> lock(g_arena_mutex);
  if (!g_arena || g_arena->max_concurrency() != threads) {
    g_arena = std::make_shared<tbb::task_arena>(threads);
  }
  return g_arena;
}

// Moves oneTBB workers onto a pool's CPUs while they work in its arena, and back when they leave.
class ConfiningObserver : public tbb::task_scheduler_observer {
 public:
  ConfiningObserver(tbb::task_arena& arena, std::vector<int> cpus)
      : tbb::task_scheduler_observer(arena), cpus_(std::move(cpus)) {
    observe(true);
  }
  ~ConfiningObserver() override { observe(false); }

  void on_scheduler_entry(bool is_worker) override {
    if (!is_worker) return;  // the pinned thread itself is on the pool already
    saved_mask() = detail::calling_thread_mask();
    detail::set_calling_thread_mask(cpus_);
  }
  void on_scheduler_exit(bool is_worker) override {
    if (!is_worker || saved_mask().empty()) return;
    detail::set_calling_thread_mask(saved_mask());
    saved_mask().clear();
  }

 private:
  static std::vector<int>& saved_mask() {
    thread_local std::vector<int> mask;
    return mask;
  }
  std::vector<int> cpus_;
};

struct ConfinedArena {
  explicit ConfinedArena(const std::vector<int>& cpus) : arena(static_cast<int>(cpus.size())), observer(arena, cpus) {}
  tbb::task_arena arena;
  ConfiningObserver observer;
};

thread_local std::shared_ptr<void> t_confined_arena;  // a ConfinedArena while the thread is pinned

struct ChunkPlan {
  int64_t n, chunks, align;
  void* ctx;
  detail::ChunkFn fn;

  void run(int64_t chunk) const { fn(ctx, chunk, boundary(chunk), boundary(chunk + 1)); }
  int64_t boundary(int64_t chunk) const {
    if (chunk >= chunks) return n;
    const int64_t raw = n / chunks * chunk + std::min(chunk, n % chunks);
    return std::min(n, raw / align * align);
  }
};

}  // namespace

std::string_view threading_backend_name(ThreadingBackend backend) noexcept {
  return backend == ThreadingBackend::openmp ? "openmp" : "tbb";
}

bool openmp_available() noexcept {
#ifdef EMBER_HAVE_OPENMP
  return true;
#else
  return false;
#endif
}

ThreadingBackend threading_backend() noexcept { return g_backend.load(std::memory_order_relaxed); }

void set_threading_backend(ThreadingBackend backend) {
  EMBER_CHECK(backend != ThreadingBackend::openmp || openmp_available(), ValueError,
              "set_threading_backend: this build of ember has no OpenMP backend (EMBER_WITH_OPENMP=OFF)");
  g_backend.store(backend, std::memory_order_relaxed);
}

int num_threads() noexcept {
  if (t_num_threads > 0) return t_num_threads;
  return openmp_available() ? detail::openmp_thread_count() : g_default_threads;
}

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1, ValueError, "set_num_threads: n must be >= 1, got ", n);
  t_num_threads = n;
}

int64_t num_chunks(int64_t n, int64_t grain) noexcept {
  if (n <= 0) return 1;
  const int64_t by_grain = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  return std::max<int64_t>(1, std::min<int64_t>(num_threads(), by_grain));
}

int64_t row_grain(int64_t rows, int64_t row_elements, int64_t parallel_elements, int64_t chunk_elements) noexcept {
  const int64_t width = std::max<int64_t>(row_elements, 1);
  // rows * width < parallel_elements, the product formed only where it cannot overflow
  const bool small = rows <= parallel_elements / width && rows * width < parallel_elements;
  return small ? std::max<int64_t>(rows, 1) : std::max<int64_t>(1, chunk_elements / width);
}

namespace detail {

void parallel_for_chunks(int64_t n, int64_t grain, int64_t align, void* ctx, ChunkFn fn) {
  if (n <= 0) return;
  const ChunkPlan plan{n, num_chunks(n, grain), std::max<int64_t>(align, 1), ctx, fn};
  if (plan.chunks == 1) {
    fn(ctx, 0, 0, n);
    return;
  }
  if (threading_backend() == ThreadingBackend::openmp) {
    openmp_run_chunks(plan.chunks, num_threads(), const_cast<ChunkPlan*>(&plan),
                      [](void* p, int64_t chunk) { static_cast<const ChunkPlan*>(p)->run(chunk); });
    return;
  }
  const std::shared_ptr<void> confined = t_confined_arena;
  const auto shared = confined ? nullptr : arena_for(num_threads());
  tbb::task_arena& arena = confined ? static_cast<ConfinedArena*>(confined.get())->arena : *shared;
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, plan.chunks, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t c = r.begin(); c < r.end(); ++c) plan.run(c);
        },
        tbb::static_partitioner());
  });
}

std::shared_ptr<void> make_confined_arena(const std::vector<int>& cpus) {
  return std::make_shared<ConfinedArena>(cpus);
}

std::shared_ptr<void> exchange_thread_arena(std::shared_ptr<void> arena) {
  std::swap(arena, t_confined_arena);
  return arena;
}

#ifndef EMBER_HAVE_OPENMP
void openmp_run_chunks(int64_t, int, void*, void (*)(void*, int64_t)) {
  throw RuntimeError("ember was built without OpenMP");
}
void openmp_set_calling_thread_budget(int) {}
int openmp_thread_count() noexcept { return 0; }
bool openmp_set_team_masks(const std::vector<std::vector<int>>&) { return true; }
std::vector<std::vector<int>> openmp_team_masks(int) { return {}; }
std::vector<int> openmp_place_cpus() { return {}; }
#endif

}  // namespace detail
}  // namespace ember
