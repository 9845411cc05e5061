// Typed exceptions of the ember core. Every public entry point validates its inputs and throws one of these;
// the Python binding maps each to the matching Python exception (TypeError, ValueError, IndexError,
// RuntimeError), so a bad argument never aborts the process. Messages name the argument and what was expected.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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
// Message building without iostreams: a Python extension may carry its own static copy of libstdc++ beside the
// process's shared one, and number formatting through std::ostream then reads locale facets of the other copy
// (seen as a crash in basic_ostream::_M_insert<long> on a build that linked libstdc++ statically).
inline void append(std::string& out, std::string_view text) { out.append(text.data(), text.size()); }
inline void append(std::string& out, const char* text) { out.append(text); }
inline void append(std::string& out, const std::string& text) { out.append(text); }
inline void append(std::string& out, char c) { out.push_back(c); }
inline void append(std::string& out, bool b) { out.append(b ? "true" : "false"); }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& out, T value) {
  out.append(std::to_string(value));
}
template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& out, T value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(value));
  out.append(buf);
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}
}  // namespace detail

/// Throws `Error` with the streamed parts as message when `condition` is false.
/// Usage: EMBER_CHECK(n >= 0, ValueError, "bf16.split: n must be >= 0, got ", n);
#define EMBER_CHECK(condition, Error, ...)                                        \
  do {                                                                            \
    if (!(condition)) throw ::ember::Error(::ember::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace ember
