#include "ember/isa.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ember/cpu_features.h"

namespace ember {
namespace {

Isa detect_level() {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return Isa::ref;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) return Isa::avx2;
  if (!f.avx512_bf16) return Isa::avx512;
  if (!(f.amx_tile && f.amx_bf16 && f.amx_int8 && f.amx_permitted)) return Isa::avx512_bf16;
  return Isa::amx;
}

Isa cap_from_env() {
  const char* env = std::getenv("EMBER_MAX_ISA");
  if (env == nullptr || *env == '\0') return Isa::amx;
  if (auto isa = parse_isa(env)) return *isa;
  std::fprintf(stderr, "ember: ignoring EMBER_MAX_ISA=%s (expected ref, avx2, avx512, avx512_bf16 or amx)\n", env);
  return Isa::amx;
}

bool verbose_from_env() {
  const char* env = std::getenv("EMBER_VERBOSE");
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

std::atomic<Isa>& cap() {
  static std::atomic<Isa> value{cap_from_env()};
  return value;
}

std::atomic<bool>& verbose_flag() {
  static std::atomic<bool> value{verbose_from_env()};
  return value;
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::ref: return "ref";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::amx: return "amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) noexcept {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "native" || lower == "all") return Isa::amx;
  for (Isa isa : kAllIsas) {
    if (lower == isa_name(isa)) return isa;
  }
  return std::nullopt;
}

Isa detected_isa() {
  static const Isa level = detect_level();
  return level;
}

Isa active_isa() {
  const Isa detected = detected_isa();
  const Isa capped = cap().load(std::memory_order_relaxed);
  return static_cast<uint8_t>(capped) < static_cast<uint8_t>(detected) ? capped : detected;
}

void set_max_isa(Isa value) { cap().store(value, std::memory_order_relaxed); }
Isa max_isa() { return cap().load(std::memory_order_relaxed); }

bool verbose() { return verbose_flag().load(std::memory_order_relaxed); }
void set_verbose(bool on) { verbose_flag().store(on, std::memory_order_relaxed); }

}  // namespace ember
