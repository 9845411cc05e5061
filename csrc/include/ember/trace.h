// EMBER_VERBOSE=1 (or set_verbose(true)): one line on stderr per kernel call, written when the call ends, as
// ONEDNN_VERBOSE writes its primitives:
//   ember_verbose,<op>,<isa>,<detail>,<milliseconds>
// <isa> is the implementation that ran (ref, avx2, avx512, avx512_bf16, amx, or the path a router took), <detail>
// the sizes it ran on. Off, a trace costs one relaxed atomic load: the detail is built only when it is printed.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ember/isa.h"

namespace ember {

class KernelTrace {
 public:
  /// Starts timing `op` if verbose is on. `path` is an Isa, a string, or a callable returning one (for a path that
  /// costs something to name); `detail` is a callable returning the sizes. Neither is evaluated when verbose is off.
  template <typename Path, typename Detail>
  KernelTrace(std::string_view op, Path&& path, Detail&& detail) {
    if (!verbose()) return;
    on_ = true;
    op_ = op;
    if constexpr (std::is_same_v<std::decay_t<Path>, Isa>) {
      path_ = isa_name(path);
    } else if constexpr (std::is_invocable_v<Path>) {
      path_ = std::forward<Path>(path)();
    } else {
      path_ = std::string_view(path);
    }
    detail_ = std::forward<Detail>(detail)();
    start_ = std::chrono::steady_clock::now();
  }
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  ~KernelTrace();  // writes the line

 private:
  bool on_ = false;
  std::string op_, path_, detail_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ember
