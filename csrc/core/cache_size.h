// How large a cache the calling threads share, from Linux's sysfs. streaming.cpp starts its streaming-store
// threshold from it; the parsing is a seam of its own so that tests can hand it a made-up sysfs tree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ember::detail {

/// Bytes of a sysfs cache size ("32768K", "1M", "512"); 0 for anything else.
int64_t parse_cache_size(std::string_view text);

/// The size of the highest-level data or unified cache under `cache_dir` (a CPU's
/// /sys/devices/system/cpu/cpuN/cache: index*/level, type, size); 0 when none can be read.
int64_t largest_cache_bytes(const std::string& cache_dir);

}  // namespace ember::detail
