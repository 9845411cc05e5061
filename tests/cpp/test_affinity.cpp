#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "ember/affinity.h"
#include "ember/errors.h"
#include "ember/parallel.h"

namespace ember {
namespace {

// Runs `body` on a fresh thread, so that pinning never leaks into the other tests of this process.
template <typename Body>
void on_fresh_thread(Body body) {
  std::thread thread(body);
  thread.join();
}

std::vector<int> first_cpus(size_t n) {
  std::vector<int> cpus = thread_affinity();
  cpus.resize(std::min(n, cpus.size()));
  return cpus;
}

TEST(Affinity, SetAndReadBackTheCallingThreadsMask) {
  on_fresh_thread([] {
    const std::vector<int> all = thread_affinity();
    ASSERT_FALSE(all.empty());
    set_thread_affinity({all.back()});
    EXPECT_EQ(thread_affinity(), std::vector<int>{all.back()});
    EXPECT_EQ(sched_getcpu(), all.back());
    set_thread_affinity(all);
    EXPECT_EQ(thread_affinity(), all);
  });
}

// The process's CPUs are the main thread's, never those of a thread pinned to a pool (OpenMP's places where it binds
// threads: the Python tests set OMP_PROC_BIND and friends in child processes, which gtest cannot do in its own).
TEST(Affinity, TheProcessCpusAreNotTheCallingThreads) {
  const std::vector<int> all = thread_affinity();
  if (std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr &&
      std::getenv("GOMP_CPU_AFFINITY") == nullptr) {
    EXPECT_EQ(process_cpus(), all);
  }
  const std::vector<int> process = process_cpus();
  on_fresh_thread([&] {
    set_thread_affinity({all.back()});
    EXPECT_EQ(process_cpus(), process);
    const std::unique_ptr<ThreadPin> pin = pin_thread({all.front()});
    EXPECT_EQ(process_cpus(), process);
    unpin_thread(*pin);
  });
}

TEST(Affinity, BadCpuListsThrowAndLeaveTheMaskAlone) {
  on_fresh_thread([] {
    const std::vector<int> before = thread_affinity();
    EXPECT_THROW(set_thread_affinity({}), ValueError);
    EXPECT_THROW(set_thread_affinity({-1}), ValueError);
    EXPECT_THROW(set_thread_affinity({CPU_SETSIZE}), ValueError);
    EXPECT_THROW(set_thread_affinity({before[0], before[0]}), ValueError);
    EXPECT_THROW(pin_thread({}), ValueError);
    EXPECT_THROW(pin_thread({before[0], before[0]}), ValueError);
    // A CPU that exists in no machine ember runs on: the OS refuses it.
    EXPECT_THROW(set_thread_affinity({CPU_SETSIZE - 1}), ValueError);
    EXPECT_THROW(pin_thread({CPU_SETSIZE - 1}), ValueError);
    EXPECT_EQ(thread_affinity(), before);
    EXPECT_TRUE(pinned_cpus().empty());
  });
}

// The case pin_thread exists for: the thread already ran a parallel region, so its OpenMP team threads exist
// and carry the old mask. After pinning, team thread t must run on cpus[t] only.
TEST(Affinity, PinMovesAnExistingOpenMpTeamAndRestoresIt) {
  if (!openmp_available()) GTEST_SKIP() << "built without OpenMP";
  on_fresh_thread([] {
    const std::vector<int> cpus = first_cpus(4);
    const int n = static_cast<int>(cpus.size());
    const std::vector<int> before = thread_affinity();
    const std::vector<std::vector<int>> team_before = team_affinity(n);  // creates the team
    const int budget_before = num_threads();

    auto pin = pin_thread(cpus);
    EXPECT_EQ(pinned_cpus(), cpus);
    EXPECT_EQ(thread_affinity(), std::vector<int>{cpus[0]});
    EXPECT_EQ(num_threads(), n);
    const auto team = team_affinity(n);
    ASSERT_EQ(team.size(), cpus.size());
    for (int t = 0; t < n; ++t) EXPECT_EQ(team[t], std::vector<int>{cpus[t]}) << "team thread " << t;

    unpin_thread(*pin);
    EXPECT_EQ(thread_affinity(), before);
    EXPECT_EQ(team_affinity(n), team_before);
    EXPECT_EQ(num_threads(), budget_before);
    EXPECT_TRUE(pinned_cpus().empty());
  });
}

// ember's loops from a pinned thread run only on the pool, on either backend.
TEST(Affinity, LoopsOfAPinnedThreadStayOnItsCpus) {
  std::vector<ThreadingBackend> backends{ThreadingBackend::tbb};
  if (openmp_available()) backends.push_back(ThreadingBackend::openmp);
  const ThreadingBackend saved = threading_backend();
  for (ThreadingBackend backend : backends) {
    set_threading_backend(backend);
    on_fresh_thread([] {
      const std::vector<int> all = thread_affinity();
      // The last CPUs but never all of them, so that a loop on the default CPUs would be caught.
      const ptrdiff_t n = all.size() > 1 ? std::min<ptrdiff_t>(2, all.size() - 1) : 1;
      const std::vector<int> cpus(all.end() - n, all.end());
      auto pin = pin_thread(cpus);
      std::mutex mutex;
      std::set<int> seen;
      for (int round = 0; round < 20; ++round) {
        parallel_for(1 << 16, 1, 1, [&](int64_t, int64_t, int64_t) {
          const int cpu = sched_getcpu();
          std::lock_guard<std::mutex> lock(mutex);
          seen.insert(cpu);
        });
      }
      for (int cpu : seen) EXPECT_TRUE(std::count(cpus.begin(), cpus.end(), cpu)) << "ran on CPU " << cpu;
      unpin_thread(*pin);
    });
  }
  set_threading_backend(saved);
}

TEST(Affinity, BudgetsArePerThread) {
  const int mine = num_threads();
  std::atomic<int> other{0};
  on_fresh_thread([&] {
    set_num_threads(mine + 3);
    other = num_threads();
  });
  EXPECT_EQ(other.load(), mine + 3);
  EXPECT_EQ(num_threads(), mine);
}

TEST(Affinity, OnlyThePinnedThreadMayUnpin) {
  std::unique_ptr<ThreadPin> pin;
  on_fresh_thread([&] { pin = pin_thread(first_cpus(1)); });
  EXPECT_THROW(unpin_thread(*pin), ValueError);
}

}  // namespace
}  // namespace ember
