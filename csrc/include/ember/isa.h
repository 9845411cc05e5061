// Instruction-set levels and run-time kernel selection.
//
// Every kernel family is compiled once per level it has an implementation for, each in its own source file with
// only that level's compiler flags, and picked at run time: the highest level that the CPU supports, the OS
// enables, and the cap allows. The reference level is portable C++ and is the test oracle for the others.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ember {

/// Ordered: each level implies the ones below it.
enum class Isa : uint8_t {
  ref = 0,          // portable C++, no intrinsics
  avx2 = 1,         // AVX2 + FMA + F16C
  avx512 = 2,       // AVX-512 F/BW/VL/DQ
  avx512_bf16 = 3,  // + AVX512-BF16 (and VNNI)
  amx = 4,          // + AMX-TILE/BF16/INT8, permission granted by the OS
};

inline constexpr Isa kAllIsas[] = {Isa::ref, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx};

std::string_view isa_name(Isa isa) noexcept;
/// Parses "ref", "avx2", "avx512", "avx512_bf16", "amx" (case-insensitive); "native"/"all" mean the highest.
std::optional<Isa> parse_isa(std::string_view name) noexcept;

/// The highest level this machine supports, ignoring the cap.
Isa detected_isa();
/// The level kernels run at: min(detected, cap). The cap starts as EMBER_MAX_ISA (default: no cap).
Isa active_isa();
/// Caps the level kernels may use; a cap above the detected level changes nothing. Thread-safe; affects the
/// next kernel call. Throws ValueError for an unknown name via parse at the binding.
void set_max_isa(Isa cap);
Isa max_isa();

/// EMBER_VERBOSE=1 (or set_verbose(true)): every kernel call logs its implementation, sizes and time to stderr
/// (ember/trace.h).
bool verbose();
void set_verbose(bool on);

/// One implementation of a kernel for one level; a family lists them from the highest level down.
template <typename Fn>
struct IsaImpl {
  Isa isa;
  Fn fn;
};

/// The first implementation whose level is at most `level`. Lists end with Isa::ref, so one always matches.
/// A list that is a variable template (one per storage type) spells its bound, `kPool<W>[3]`: GCC 13 cannot deduce
/// N from a variable template of unknown bound used inside another template.
template <typename Fn, size_t N>
const IsaImpl<Fn>& select_impl(const IsaImpl<Fn> (&impls)[N], Isa level) {
  for (const auto& impl : impls) {
    if (static_cast<uint8_t>(impl.isa) <= static_cast<uint8_t>(level)) return impl;
  }
  return impls[N - 1];
}

}  // namespace ember
