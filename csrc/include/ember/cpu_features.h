// What the processor and the operating system let ember use, read once from CPUID and XCR0.
#pragma once

#include <string>

namespace ember {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // "Intel(R) Xeon(R) Platinum 8480+", ...
  // Each flag is true only when the CPU has the instructions and the OS saves their registers (XCR0).
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
  /// Linux granted this process the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM). Without it the first
  /// AMX instruction kills the process, so AMX kernels run only when this is true.
  bool amx_permitted = false;
};

/// The features of this machine. Detected on first call (thread-safe), which also asks Linux for AMX permission
/// when the CPU has AMX.
const CpuFeatures& cpu_features();

}  // namespace ember
