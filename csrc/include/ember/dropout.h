// Dropout with a counter-based generator: y = x * (keep ? 1 / (1 - p) : 0), where whether element i is kept is a
// pure function of (seed, i). Nothing is stored for backward: the gradient is the same call on the incoming
// gradient with the same seed, which regenerates the same mask. Every element draws its own 32-bit word, so the
// work splits over threads and vector lanes with no shared generator state, and the result does not depend on
// the thread count or the ISA.
//
// The generator is Philox4x32-10 (ember/philox.h): the key is the seed, the counter (block, 0) for a 64-bit block
// index, and each block gives four 32-bit words.
//
// Which word element i gets: elements are taken in tiles of 64; in tile t, element 64t + 16w + j takes word w of
// block 16t + j (j < 16, w < 4). A 16-lane vector then computes the 16 blocks of a tile at once and each of the
// four words it gets back is 16 consecutive elements, with no transposition; an 8-lane vector does a tile in two
// halves. The scalar functions below are the definition; every vector path matches them bit for bit.
//
// Element i is kept when its word u satisfies u >= threshold, threshold = round(p * 2^32): the keep probability
// is 1 - p to within 2^-33 (2^-32 for p within 2^-33 of 1, whose threshold stops at 2^32 - 1). The scale is float(1 /
// (1 - p)), and the product x * scale is computed in float32 (bf16 inputs are widened exactly, the product rounded to
// nearest even), which is what torch computes. A dropped element is x * 0: +-0, or NaN for an infinite or NaN x, as in
// torch (which multiplies by its mask). p = 1 drops every element (scale 0).
#pragma once

#include <cstdint>

#include "ember/isa.h"
#include "ember/philox.h"
#include "ember/tensor_view.h"

namespace ember::dropout {

/// What one dropout call needs besides its tensors. Build it with make_params, which checks p.
struct Params {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // a word >= threshold keeps its element (0 when p == 1: see scale)
  float scale = 1.0f;      // the factor of a kept element; 0 when p == 1, which drops every element
};

/// Params for drop probability p in [0, 1]; throws ValueError otherwise (NaN included).
Params make_params(double p, uint64_t seed);

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// Raw-pointer entry points on n contiguous elements; `y` may be `x` (in place) but must not overlap it
/// otherwise (unchecked here). Element i of the arrays is element i of the definition above. Parallel over
/// num_threads() for large n; the result does not depend on the thread count.
void apply(const float* x, float* y, int64_t n, const Params& params);
void apply_bf16(const uint16_t* x, uint16_t* y, int64_t n, const Params& params);

/// Checked entry point: x float32 or bfloat16; out of x's dtype, shape and strides, dense (every element once, in
/// any order of the dimensions: element i of the definition is the i-th element in memory), and either x itself
/// (in place) or sharing no memory with it. A failed check throws before anything is written.
void apply(const TensorView& x, const TensorView& out, double p, uint64_t seed);

// --- Scalar definitions -----------------------------------------------------------------------------------------

/// The word element i draws (the tile mapping above).
inline uint32_t element_word(uint64_t seed, uint64_t i) noexcept {
  const uint64_t tile = i / 64, k = i % 64;
  return philox::block_words(seed, 16 * tile + k % 16)[k / 16];
}

/// The factor element i is multiplied by: scale when kept, 0 when dropped.
inline float element_factor(const Params& params, uint64_t i) noexcept {
  return element_word(params.seed, i) >= params.threshold ? params.scale : 0.0f;
}

}  // namespace ember::dropout
