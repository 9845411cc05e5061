#include "core/cache_size.h"

#include <cctype>
#include <fstream>
#include <limits>

namespace ember::detail {
namespace {

// The first line of a sysfs attribute file; empty when it cannot be read.
std::string read_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// A run of decimal digits as a number; 0 for anything else (empty, a sign, a space, more than 15 digits).
int64_t parse_digits(std::string_view text) {
  if (text.empty() || text.size() > 15) return 0;
  int64_t value = 0;
  for (const char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return 0;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

int64_t parse_cache_size(std::string_view text) {
  int64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': scale = int64_t{1} << 10; break;
      case 'M': scale = int64_t{1} << 20; break;
      case 'G': scale = int64_t{1} << 30; break;
      default: break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  // A value that would overflow once scaled is no cache size: refuse it.
  const int64_t value = parse_digits(text);
  return value <= (std::numeric_limits<int64_t>::max() >> 30) ? value * scale : 0;
}

int64_t largest_cache_bytes(const std::string& cache_dir) {
  int64_t best_level = 0, best_bytes = 0;
  // index0, index1, ... run without gaps (Documentation/ABI/testing/sysfs-devices-system-cpu); a dozen is more
  // than any CPU has (L1d, L1i, L2, L3, and an L4 on a few).
  for (int index = 0; index < 16; ++index) {
    const std::string dir = cache_dir + "/index" + std::to_string(index) + "/";
    const std::string level_text = read_line(dir + "level");
    if (level_text.empty()) break;
    const std::string type = read_line(dir + "type");
    if (type != "Data" && type != "Unified") continue;  // an instruction cache holds no output
    const int64_t level = parse_digits(level_text);
    const int64_t bytes = parse_cache_size(read_line(dir + "size"));
    if (bytes > 0 && level > best_level) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

}  // namespace ember::detail
