#include "ember/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace ember {
namespace {

struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) r = Regs{};
  return r;
}

bool bit(uint32_t reg, int n) { return (reg >> n) & 1U; }

// XGETBV(0): which register states the OS saves on a context switch. Without the OS's support an instruction set
// the CPU has is still unusable, so every feature below checks its XCR0 bits too.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Linux (5.16+) keeps the 8 KiB AMX tile state off until a process asks for it; an AMX instruction before that
// raises SIGILL. oneDNN asks the same way.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchGetXcompPerm = 0x1022;
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr unsigned long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask >> kXfeatureXtiledata) & 1UL;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs leaf0 = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &leaf0.ebx, 4);
  std::memcpy(vendor + 4, &leaf0.edx, 4);
  std::memcpy(vendor + 8, &leaf0.ecx, 4);
  f.vendor = vendor;

  if (cpuid(0x80000000).eax >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      char* const words = brand + size_t{16} * i;  // each leaf holds 16 characters of the brand string
      std::memcpy(words + 0, &r.eax, 4);
      std::memcpy(words + 4, &r.ebx, 4);
      std::memcpy(words + 8, &r.ecx, 4);
      std::memcpy(words + 12, &r.edx, 4);
    }
    f.brand = brand;
    const auto first = f.brand.find_first_not_of(' ');
    f.brand = first == std::string::npos ? "" : f.brand.substr(first);
  }

  const uint32_t max_leaf = leaf0.eax;
  const Regs leaf1 = cpuid(1);
  if (!bit(leaf1.ecx, 27)) return f;  // no OSXSAVE: the OS manages no extended state, so no AVX of any kind
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                 // XMM + YMM
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask + ZMM_Hi256 + Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;         // XTILECFG + XTILEDATA

  const Regs leaf7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs leaf7_1 = max_leaf >= 7 && leaf7.eax >= 1 ? cpuid(7, 1) : Regs{};

  const bool avx = os_avx && bit(leaf1.ecx, 28);
  f.fma = avx && bit(leaf1.ecx, 12);
  f.f16c = avx && bit(leaf1.ecx, 29);
  f.avx2 = avx && bit(leaf7.ebx, 5);
  f.avx512f = os_avx512 && bit(leaf7.ebx, 16);
  f.avx512dq = f.avx512f && bit(leaf7.ebx, 17);
  f.avx512bw = f.avx512f && bit(leaf7.ebx, 30);
  f.avx512vl = f.avx512f && bit(leaf7.ebx, 31);
  f.avx512_vnni = f.avx512f && bit(leaf7.ecx, 11);
  f.avx512_fp16 = f.avx512f && bit(leaf7.edx, 23);
  f.avx512_bf16 = f.avx512f && bit(leaf7_1.eax, 5);
  f.amx_bf16 = os_amx && bit(leaf7.edx, 22);
  f.amx_tile = os_amx && bit(leaf7.edx, 24);
  f.amx_int8 = os_amx && bit(leaf7.edx, 25);
  if (f.amx_tile) f.amx_permitted = request_amx_permission();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace ember
