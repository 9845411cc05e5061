#include "ember/config.h"

#include <oneapi/tbb/version.h>

namespace ember {

BuildInfo build_info() {
  BuildInfo info;
  info.version = EMBER_VERSION_STRING;
  info.build_type = EMBER_BUILD_TYPE;
#if defined(__clang__)
  info.compiler = std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  info.compiler = std::string("GNU ") + __VERSION__;
#else
  info.compiler = "unknown";
#endif
#ifdef EMBER_HAVE_OPENMP
  info.openmp = true;
#endif
  return info;
}

std::string tbb_version() { return TBB_runtime_version(); }

}  // namespace ember
