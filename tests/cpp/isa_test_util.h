// Runs a test body once per ISA level this machine supports, with the cap set to that level, so every compiled
// path is exercised and compared with the reference (the way Highway and FBGEMM test).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "ember/isa.h"

namespace ember::testing {

inline std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas) {
    if (static_cast<int>(isa) <= static_cast<int>(detected_isa())) out.push_back(isa);
  }
  return out;
}

/// Sets the ISA cap for the lifetime of the object and restores the previous one.
class ScopedIsaCap {
 public:
  explicit ScopedIsaCap(Isa cap) : previous_(max_isa()) { set_max_isa(cap); }
  ~ScopedIsaCap() { set_max_isa(previous_); }
  ScopedIsaCap(const ScopedIsaCap&) = delete;
  ScopedIsaCap& operator=(const ScopedIsaCap&) = delete;

 private:
  Isa previous_;
};

}  // namespace ember::testing
