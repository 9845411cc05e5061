#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/cache_size.h"
#include "core/thread_placement.h"
#include "ember/streaming.h"

namespace ember::detail {
namespace {

namespace fs = std::filesystem;

// A made-up /sys/devices/system/cpu/cpuN/cache: one index directory per (level, type, size).
class FakeCacheDir {
 public:
  explicit FakeCacheDir(const std::string& name) : root_(fs::path(testing::TempDir()) / name) {
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~FakeCacheDir() { fs::remove_all(root_); }

  void add(const std::string& level, const std::string& type, const std::string& size) {
    const fs::path dir = root_ / ("index" + std::to_string(count_++));
    fs::create_directories(dir);
    std::ofstream(dir / "level") << level << "\n";
    std::ofstream(dir / "type") << type << "\n";
    std::ofstream(dir / "size") << size << "\n";
  }
  std::string path() const { return root_.string(); }

 private:
  fs::path root_;
  int count_ = 0;
};

TEST(CacheSize, ParsesSysfsSizes) {
  EXPECT_EQ(parse_cache_size("32768K"), int64_t{32} << 20);
  EXPECT_EQ(parse_cache_size("1M"), int64_t{1} << 20);
  EXPECT_EQ(parse_cache_size("2G"), int64_t{2} << 30);
  EXPECT_EQ(parse_cache_size("512"), 512);
  for (const char* bad : {"", "K", "-1K", "12 K", "1.5M", "0x10", "99999999999999999K"}) {
    EXPECT_EQ(parse_cache_size(bad), 0) << bad;
  }
}

TEST(CacheSize, TakesTheHighestLevelDataOrUnifiedCache) {
  FakeCacheDir zen5("cache_zen5");  // a Zen 5 core: L1d 48K, L1i 32K, L2 1M, the CCD's L3 32M
  zen5.add("1", "Data", "48K");
  zen5.add("1", "Instruction", "32K");
  zen5.add("2", "Unified", "1024K");
  zen5.add("3", "Unified", "32768K");
  EXPECT_EQ(largest_cache_bytes(zen5.path()), int64_t{32} << 20);

  FakeCacheDir odd("cache_odd");  // an instruction cache above the rest is skipped, and so is an unreadable size
  odd.add("1", "Data", "32K");
  odd.add("2", "Unified", "2M");
  odd.add("3", "Unified", "lots");
  odd.add("4", "Instruction", "64M");
  EXPECT_EQ(largest_cache_bytes(odd.path()), int64_t{2} << 20);
}

TEST(CacheSize, NothingReadableIsZero) {
  EXPECT_EQ(largest_cache_bytes(testing::TempDir() + "/no_such_cache_dir"), 0);
  FakeCacheDir instruction_only("cache_instruction_only");
  instruction_only.add("1", "Instruction", "32K");
  EXPECT_EQ(largest_cache_bytes(instruction_only.path()), 0);
}

TEST(CacheSize, TheLastLevelCacheIsTheFirstCpusLargest) {
  // ctest runs each test in a process of its own, so this thread's mask is the one last_level_cache_bytes saw.
  const std::vector<int> cpus = calling_thread_mask();
  ASSERT_FALSE(cpus.empty());
  const int64_t from_sysfs =
      largest_cache_bytes("/sys/devices/system/cpu/cpu" + std::to_string(cpus.front()) + "/cache");
  if (from_sysfs == 0) GTEST_SKIP() << "sysfs describes no cache here";
  EXPECT_EQ(last_level_cache_bytes(), from_sysfs);
}

}  // namespace
}  // namespace ember::detail
