// EMBER_VERBOSE=1 (or set_verbose(true)): one line on stderr per kernel call, written when the call ends, as
// ONEDNN_VERBOSE writes its primitives:
//   ember_verbose,<op>,<isa>,<detail>,<milliseconds>
// <isa> is the implementation that ran (ref, avx2, avx512, avx512_bf16, amx, or the path a router took), <detail>
// the sizes it ran on. Off, a trace costs one relaxed atomic load: the detail is built only when it is printed.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include "ember/isa.h"

namespace ember {

class KernelTrace {
 public:
  /// Starts timing `op` if verbose is on; `detail` is a callable returning the sizes as a string.
  template <typename Detail>
  KernelTrace(std::string_view op, std::string_view path, Detail&& detail) {
    if (!verbose()) return;
    on_ = true;
    op_ = op;
    path_ = path;
    detail_ = std::forward<Detail>(detail)();
    start_ = std::chrono::steady_clock::now();
  }
  template <typename Detail>
  KernelTrace(std::string_view op, Isa isa, Detail&& detail)
      : KernelTrace(op, isa_name(isa), std::forward<Detail>(detail)) {}
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  ~KernelTrace();  // writes the line

 private:
  bool on_ = false;
  std::string op_, path_, detail_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ember
