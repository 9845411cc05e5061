#include "ember/trace.h"

#include <cstdio>

namespace ember {

KernelTrace::~KernelTrace() {
  if (!on_) return;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  // One fprintf call per line: lines from several threads do not interleave.
  std::fprintf(stderr, "ember_verbose,%s,%s,%s,%.4f\n", op_.c_str(), path_.c_str(), detail_.c_str(), ms);
}

}  // namespace ember
