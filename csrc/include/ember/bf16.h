// bfloat16 conversion: rounding fp32 to bf16, and the split-BF16 representation of fp32 master weights.
//
// split(x) -> (top, bottom): top is the high 16 bits of x's bit pattern (a bf16 value: x truncated toward zero),
// bottom the low 16 bits. join(top, bottom) puts them back together: bit for bit x, for every fp32 pattern.
// Why truncate instead of round: no mapping of 32 bits to (16, 16) that can be undone can keep every NaN a NaN in
// `top` (there are 2^23-1 fp32 NaNs per sign but only 127 bf16 NaN tops, each with 2^16 bottoms), and truncation
// loses the fewest: only the 2^16-1 signalling NaNs per sign whose payload lies wholly in the low 16 bits get an
// infinite top, while every NaN that arithmetic produces stays NaN. Rounding would also carry 0x7FFF8000.. into
// the sign bit (NaN -> -0.0) and turn the largest finite values into infinities. Truncation keeps sign, finiteness
// and zero exactly and costs a shift; its error in `top` is below one bf16 ulp, and training still updates the
// full fp32 value, so the bias does not accumulate.
//
// round(x): fp32 -> bf16, round to nearest even on the bit pattern (denormals round too, as torch does);
// NaN stays NaN, keeping its sign and top payload bits with the quiet bit set.
//
// Memory traffic per element: split reads 4 bytes and writes 2 + 2; join reads 2 + 2 and writes 4; round reads 4
// and writes 2.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "ember/isa.h"
#include "ember/tensor_view.h"

namespace ember::bf16 {

enum class Op : uint8_t { split, join, round };
std::string_view op_name(Op op) noexcept;
/// The level of the implementation that `op` runs at under the current ISA cap.
Isa implementation(Op op);

// Raw-pointer entry points on contiguous arrays of n elements, parallel over num_threads() for large n.
// Arrays must not overlap (unchecked here; the TensorView entry points check).
void split(const float* src, uint16_t* top, uint16_t* bottom, int64_t n);
void join(const uint16_t* top, const uint16_t* bottom, float* dst, int64_t n);
void round(const float* src, uint16_t* dst, int64_t n);

// Checked entry points: x float32; top bfloat16; bottom int16; out float32 for join, bfloat16 for round; all
// contiguous (round: x dense in any order of its dimensions, out with x's strides), of one shape, outputs sharing no
// memory with anything else. A failed check throws before anything is written.
void split(const TensorView& x, const TensorView& top, const TensorView& bottom);
void join(const TensorView& top, const TensorView& bottom, const TensorView& out);
void round(const TensorView& x, const TensorView& out);

// Scalar definitions: the specification that every vectorized path must match bit for bit.
inline uint32_t float_bits(float x) noexcept {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
inline float bits_float(uint32_t bits) noexcept {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
/// The float32 a bfloat16 bit pattern stands for (exact: bf16 is float32's top half).
inline float widen(uint16_t bits) noexcept { return bits_float(static_cast<uint32_t>(bits) << 16); }
inline uint16_t round_bits(uint32_t bits) noexcept {
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((bits >> 16) | 0x0040U);
  return static_cast<uint16_t>((bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16);
}
inline uint16_t split_top(uint32_t bits) noexcept { return static_cast<uint16_t>(bits >> 16); }
inline uint16_t split_bottom(uint32_t bits) noexcept { return static_cast<uint16_t>(bits & 0xFFFFU); }
inline uint32_t join_bits(uint16_t top, uint16_t bottom) noexcept {
  return (static_cast<uint32_t>(top) << 16) | bottom;
}

}  // namespace ember::bf16
