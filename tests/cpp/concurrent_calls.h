// Several threads calling one object at once, for the tests of layers whose cached primitives are shared between
// callers (onednn::BoundPrimitive).
#pragma once

#include <thread>
#include <vector>

#include "ember/parallel.h"

namespace ember::testing {

/// Runs `call(t, i)` for i in [0, calls) on each of `threads` threads t at once, and returns per thread how many
/// of its calls returned false (a wrong result). Each thread runs with the caller's thread budget (budgets are
/// per thread).
template <typename Call>
std::vector<int> failures_on_threads(int threads, int calls, const Call& call) {
  std::vector<int> failures(static_cast<size_t>(threads), 0);
  std::vector<std::thread> workers;
  const int budget = num_threads();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      set_num_threads(budget);
      for (int i = 0; i < calls; ++i) failures[t] += call(t, i) ? 0 : 1;
    });
  }
  for (std::thread& worker : workers) worker.join();
  return failures;
}

}  // namespace ember::testing
