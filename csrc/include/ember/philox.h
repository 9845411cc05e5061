// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw ("Parallel random numbers: as easy
// as 1, 2, 3", SC 2011): ten rounds of two 32x32->64-bit multiplies turn a 128-bit counter and a 64-bit key into
// four 32-bit words. It passes TestU01's BigCrush; cuRAND, JAX and torch's CUDA generator use it.
//
// The scalar functions are the definition that every vector implementation must match bit for bit (the known
// answers of the authors' Random123 are in tests/cpp/test_dropout.cpp). Vector kernels include this header for
// the constants only: a kernel file compiled with wide-vector flags must not call the inline functions, or the
// linker could keep its copy of them for code that runs on smaller CPUs.
#pragma once

#include <array>
#include <cstdint>

namespace ember::philox {

inline constexpr uint32_t kM0 = 0xD2511F53U;
inline constexpr uint32_t kM1 = 0xCD9E8D57U;
inline constexpr uint32_t kW0 = 0x9E3779B9U;  // the key schedule's increments: golden ratio,
inline constexpr uint32_t kW1 = 0xBB67AE85U;  // sqrt(3) - 1
inline constexpr int kRounds = 10;

/// Philox4x32-10 of counter `ctr` under key (k0, k1).
inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, uint32_t k0, uint32_t k1) noexcept {
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
  }
  return ctr;
}

/// The four words of block `block` under `key`: counter (block, 0), key split low word first.
inline std::array<uint32_t, 4> block_words(uint64_t key, uint64_t block) noexcept {
  return philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0U, 0U},
                    static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

}  // namespace ember::philox
