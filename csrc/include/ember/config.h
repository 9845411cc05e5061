// What this build of ember is and what it runs on: the data behind ember.show_config().
#pragma once

#include <string>

namespace ember {

struct BuildInfo {
  std::string version;     // ember's version, from CMakeLists.txt
  std::string build_type;  // CMake build type
  std::string compiler;    // e.g. "GNU 12.2.0"
  bool openmp = false;     // the OpenMP threading backend is compiled in
};
BuildInfo build_info();

struct OneDnnInfo {
  int major = 0, minor = 0, patch = 0;
  std::string commit;       // git hash oneDNN was built from
  std::string cpu_runtime;  // "TBB", "OpenMP", "sequential", ...
  std::string cpu_isa;      // the ISA oneDNN's JIT will use here, e.g. "avx512_core_amx"
};
OneDnnInfo onednn_info();

/// oneTBB's run-time version, e.g. "2021.13.1" (from the loaded library, not the headers).
std::string tbb_version();

}  // namespace ember
