// The float64 reference of each post-op, shared by the tests of the oneDNN layers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ember/epilogue.h"

namespace ember::testing {

inline double apply(Activation act, double x) {
  switch (act) {
    case Activation::relu:
      return x < 0 ? 0 : x;  // NaN stays NaN, as in torch
    // The GELUs in forms that do not cancel where the result is tiny: 1 + erf(x/√2) = erfc(-x/√2), and
    // 1 + tanh(u) = 2/(1 + e^-2u) (in float64, 1 + tanh(u) is 0 from u ~ -19 on).
    case Activation::gelu_erf: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::gelu_tanh: return x / (1 + std::exp(-2 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::silu: return x / (1 + std::exp(-x));
    case Activation::sigmoid: return 1 / (1 + std::exp(-x));
    case Activation::tanh: return std::tanh(x);
    case Activation::hardswish: return x * std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case Activation::hardsigmoid: return std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case Activation::relu6: return std::min(std::max(x, 0.0), 6.0);
  }
  return x;
}

/// A result against its float64 reference where either may be non-finite: NaN exactly where the reference is NaN,
/// the same infinity, else within `tol`.
inline ::testing::AssertionResult matches_reference(double got, double want, double tol) {
  const bool ok = std::isnan(want) ? std::isnan(got) : std::isinf(want) ? got == want : std::fabs(got - want) <= tol;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (tolerance " << tol << ")";
}

}  // namespace ember::testing
