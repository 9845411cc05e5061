// Thread placement: OS affinity masks, and pin_thread, which moves a thread together with the OpenMP team and
// oneTBB arena its kernels run on (see ember/affinity.h for why all three).
#include "ember/affinity.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "core/thread_placement.h"
#include "ember/errors.h"
#include "ember/parallel.h"

namespace ember {

namespace {

// sched_getaffinity of `who` (0: the calling thread; the process id: the main thread), ascending; empty on failure.
std::vector<int> affinity_of(pid_t who) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(who, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

namespace detail {

int set_calling_thread_mask(const std::vector<int>& cpus) noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return EINVAL;
    CPU_SET(cpu, &set);
  }
  return sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
}

std::vector<int> calling_thread_mask() { return affinity_of(0); }

}  // namespace detail

namespace {

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (int cpu : cpus) out += (out.empty() ? "" : ",") + std::to_string(cpu);
  return out;
}

// Every id in range and none twice. Whether the process may use them is the kernel's to say: sched_setaffinity
// refuses a set with no CPU of the cgroup's cpuset, and the callers turn that refusal into a ValueError.
void check_cpus(const char* op, const std::vector<int>& cpus) {
  EMBER_CHECK(!cpus.empty(), ValueError, op, ": cpus must name at least one CPU");
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    EMBER_CHECK(sorted[i] >= 0 && sorted[i] < CPU_SETSIZE, ValueError, op, ": CPU id ", sorted[i], " is outside [0, ",
                CPU_SETSIZE, ")");
    EMBER_CHECK(i == 0 || sorted[i] != sorted[i - 1], ValueError, op, ": CPU ", sorted[i], " is named twice in [",
                cpu_list(cpus), "]");
  }
}

thread_local std::vector<int> t_pinned;

}  // namespace

std::vector<int> thread_affinity() { return detail::calling_thread_mask(); }

std::vector<int> process_cpus() {
  std::vector<int> cpus = detail::openmp_place_cpus();
  return cpus.empty() ? affinity_of(getpid()) : cpus;
}

void set_thread_affinity(const std::vector<int>& cpus) {
  check_cpus("set_thread_affinity", cpus);
  const int err = detail::set_calling_thread_mask(cpus);
  EMBER_CHECK(err == 0, ValueError, "set_thread_affinity: the OS refused CPUs [", cpu_list(cpus), "] for this thread (",
              std::strerror(err), "); the process may run on [", cpu_list(thread_affinity()),
              "] and its cgroup's cpuset");
}

std::vector<std::vector<int>> team_affinity(int threads) {
  EMBER_CHECK(threads >= 1, ValueError, "team_affinity: threads must be >= 1, got ", threads);
  return detail::openmp_team_masks(threads);
}

ThreadPin::~ThreadPin() = default;

std::unique_ptr<ThreadPin> pin_thread(const std::vector<int>& cpus) {
  check_cpus("pin_thread", cpus);
  const int n = static_cast<int>(cpus.size());
  std::unique_ptr<ThreadPin> pin(new ThreadPin());
  pin->cpus_ = cpus;
  pin->owner_ = static_cast<unsigned long long>(pthread_self());
  pin->previous_budget_ = num_threads();
  pin->previous_openmp_threads_ = detail::openmp_thread_count();
  pin->previous_mask_ = detail::calling_thread_mask();
  pin->previous_pinned_ = t_pinned;

  // The calling thread first: if the OS refuses the set, nothing else has changed yet.
  const int err = detail::set_calling_thread_mask(std::vector<int>(1, cpus[0]));
  EMBER_CHECK(err == 0, ValueError, "pin_thread: the OS refused CPU ", cpus[0], " for this thread (",
              std::strerror(err), ")");
  pin->previous_team_masks_ = detail::openmp_team_masks(n);
  std::vector<std::vector<int>> masks(n);
  for (int t = 0; t < n; ++t) masks[t].assign(1, cpus[t]);  // not = {cpus[t]}: GCC 13 -Warray-bounds false positive
  if (!detail::openmp_set_team_masks(masks)) {
    detail::openmp_set_team_masks(pin->previous_team_masks_);
    detail::set_calling_thread_mask(pin->previous_mask_);
    throw ValueError("pin_thread: could not place an OpenMP team of " + std::to_string(n) + " threads on CPUs [" +
                     cpu_list(cpus) + "] (OMP_THREAD_LIMIT, or CPUs outside this process's cpuset)");
  }
  detail::openmp_set_calling_thread_budget(n);
  set_num_threads(n);
  pin->previous_arena_ = detail::exchange_thread_arena(detail::make_confined_arena(cpus));
  t_pinned = cpus;
  return pin;
}

void unpin_thread(const ThreadPin& pin) {
  EMBER_CHECK(pin.owner_ == static_cast<unsigned long long>(pthread_self()), ValueError,
              "unpin_thread: a pin must be undone by the thread it pinned");
  detail::exchange_thread_arena(pin.previous_arena_);
  // The team as it was: same size as when the masks were read, so the same pool threads answer.
  if (!pin.previous_team_masks_.empty()) detail::openmp_set_team_masks(pin.previous_team_masks_);
  detail::set_calling_thread_mask(pin.previous_mask_);
  if (pin.previous_openmp_threads_ > 0) detail::openmp_set_calling_thread_budget(pin.previous_openmp_threads_);
  set_num_threads(pin.previous_budget_);
  t_pinned = pin.previous_pinned_;
}

std::vector<int> pinned_cpus() { return t_pinned; }

}  // namespace ember
