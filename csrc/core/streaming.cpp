#include "ember/streaming.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cache_size.h"
#include "core/thread_placement.h"
#include "ember/errors.h"

namespace ember {
namespace {

// The largest cache of the first CPU the calling thread may run on, as sysfs describes it: the cache the threads
// there share.
// sysconf is the fallback only: glibc derives it from CPUID, which describes the whole part; on a 12-CCD EPYC
// (a 2-CPU VM on Zen 5) it says 384 MiB where the CPUs share one CCD's 32 MiB, and outputs of 32-384 MiB were
// written through the cache, 3x slower than streamed (bf16 round of 8-32M floats).
int64_t detect_llc() {
  const std::vector<int> cpus = detail::calling_thread_mask();
  const int cpu = cpus.empty() ? 0 : cpus.front();
  const int64_t shared = detail::largest_cache_bytes("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache");
  if (shared > 0) return shared;
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(name);
    if (bytes > 0) return bytes;
  }
  return int64_t{32} << 20;
}

int64_t initial_threshold() {
  if (const char* env = std::getenv("EMBER_STREAM_THRESHOLD")) {
    char* end = nullptr;
    const long long value = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && value >= 0) return value;
  }
  return last_level_cache_bytes();
}

std::atomic<int64_t>& threshold() {
  static std::atomic<int64_t> value{initial_threshold()};
  return value;
}

}  // namespace

int64_t last_level_cache_bytes() {
  static const int64_t bytes = detect_llc();
  return bytes;
}

int64_t stream_threshold_bytes() { return threshold().load(std::memory_order_relaxed); }

void set_stream_threshold_bytes(int64_t bytes) {
  EMBER_CHECK(bytes >= 0, ValueError, "set_stream_threshold_bytes: bytes must be >= 0, got ", bytes);
  threshold().store(bytes, std::memory_order_relaxed);
}

}  // namespace ember
