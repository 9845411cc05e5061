// Typed exceptions of the ember core. Every public entry point validates its inputs and throws one of these;
// the Python binding maps each to the matching Python exception (TypeError, ValueError, IndexError,
// RuntimeError), so a bad argument never aborts the process. Messages name the argument and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ember {

/// An argument of the wrong kind: dtype, device, object type.
class TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An argument of the right kind with a wrong value: shape, stride, range of a scalar, aliasing.
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An index outside the range it indexes into.
class IndexError : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

/// A failure that is not the caller's fault: an unsupported CPU, a library error.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

/// Throws `Error` with the streamed parts as message when `condition` is false.
/// Usage: EMBER_CHECK(n >= 0, ValueError, "bf16.split: n must be >= 0, got ", n);
#define EMBER_CHECK(condition, Error, ...)                          \
  do {                                                              \
    if (!(condition)) throw ::ember::Error(::ember::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace ember
