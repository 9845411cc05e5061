// When kernels write their outputs with non-temporal (streaming) stores.
//
// A streaming store skips the read-for-ownership of the output cache line and does not keep the line in cache:
// a win when the call moves more data than the last-level cache holds (the output would be evicted before
// anyone read it anyway), a loss when the output is read again while still cached. Kernels stream when the
// bytes one call moves exceed this threshold, which defaults to the size of the last-level cache.
#pragma once

#include <cstdint>

namespace ember {

/// Bytes of the largest cache of the first CPU the calling thread may run on (sysfs; sysconf's last level where
/// sysfs does not say, 32 MiB where neither does). Read once, at the first call.
int64_t last_level_cache_bytes();
/// Calls that move more bytes than this stream their outputs. Starts at last_level_cache_bytes(), or at
/// EMBER_STREAM_THRESHOLD (bytes) when that is set.
int64_t stream_threshold_bytes();
/// Sets the threshold (0: always stream; a huge value: never). Throws ValueError for a negative value.
void set_stream_threshold_bytes(int64_t bytes);
inline bool should_stream(int64_t bytes_moved) { return bytes_moved > stream_threshold_bytes(); }

}  // namespace ember
