// Checked size arithmetic for the core's entry points. A size, count or offset derived from user input (a sampling
// ratio, an output size, a bag count times a row width) can overflow int64_t before any allocation or bounds check
// sees it, and signed overflow is undefined behaviour: the product must be checked as it is formed. These helpers
// throw ValueError naming the operator and the quantity instead, so the binding raises a Python exception rather
// than the process allocating a wrapped-around size (or std::vector reporting "larger than max_size()").
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "ember/errors.h"

namespace ember::checked {

/// a * b, or ValueError "<op>: <what> overflows int64 (a x b)" when it does not fit. Both must be >= 0.
inline int64_t mul(std::string_view op, std::string_view what, int64_t a, int64_t b) {
  int64_t product = 0;
  EMBER_CHECK(a >= 0 && b >= 0, ValueError, op, ": ", what, " must be >= 0, got factors ", a, " and ", b);
  EMBER_CHECK(!__builtin_mul_overflow(a, b, &product), ValueError, op, ": ", what, " overflows int64 (", a, " x ", b,
              ")");
  return product;
}

/// The product of every factor, checked at each step (see mul).
template <typename... Rest>
int64_t mul(std::string_view op, std::string_view what, int64_t a, int64_t b, int64_t c, Rest... rest) {
  return mul(op, what, mul(op, what, a, b), c, rest...);
}

/// a + b for a, b >= 0, or ValueError when it does not fit.
inline int64_t add(std::string_view op, std::string_view what, int64_t a, int64_t b) {
  int64_t sum = 0;
  EMBER_CHECK(a >= 0 && b >= 0, ValueError, op, ": ", what, " must be >= 0, got terms ", a, " and ", b);
  EMBER_CHECK(!__builtin_add_overflow(a, b, &sum), ValueError, op, ": ", what, " overflows int64 (", a, " + ", b, ")");
  return sum;
}

/// A count that will size an array of `element_bytes`-byte elements: ValueError when count * element_bytes does not
/// fit in the address space's signed range, the bound std::vector and operator new share, so the refusal names the
/// quantity instead of surfacing as std::length_error.
inline int64_t array_count(std::string_view op, std::string_view what, int64_t count, int64_t element_bytes) {
  const int64_t bytes = mul(op, what, count, element_bytes);
  EMBER_CHECK(bytes <= std::numeric_limits<std::ptrdiff_t>::max(), ValueError, op, ": ", what, " of ", count,
              " elements cannot be allocated");
  return count;
}

/// A floating-point value converted to int64_t, or ValueError when it is not finite or out of range (the cast
/// would be undefined behaviour).
inline int64_t to_int64(std::string_view op, std::string_view what, double value) {
  // 2^63 is exactly representable; every double below it converts.
  EMBER_CHECK(std::isfinite(value) && value > -9.2233720368547758e18 && value < 9.2233720368547758e18, ValueError, op,
              ": ", what, " of ", value, " does not fit in int64");
  return static_cast<int64_t>(value);
}

}  // namespace ember::checked
