// Scaled dot-product attention, AMX path (bf16). The same schedule as attention_body.inl (a query block of one head
// against each block of keys, 256 here, with the running softmax), with both products as tile multiplies
// (tdpbf16ps: 16 rows by 16 columns by 32 bf16 pairs a instruction, 16x the multiply-adds of vdpbf16ps):
//
//   scores:  S[16 queries][16 keys] += Q[16 queries][32 features] · Kt[16 feature pairs][16 keys, pairs]
//   output:  O[16 queries][16 features] += P[16 queries][32 keys] · Vt[16 key pairs][16 features, pairs]
//
// Queries lie along tile rows, so the softmax runs along rows of S (AVX-512, float32), and P is rounded to bf16
// for the second product, as torch's own kernels round it. Keys and values arrive packed (pack_keys_values_amx,
// run once a call over every head). Tiles: 0-3 hold sums (C); 4 the A operand and 5-7 the B operands where a
// product takes 16 queries, 4-5 the A operands and 6-7 the B operands where it takes 32 (the 2x2 forms).
// Compiled with the AVX-512 flags plus -mavx512bf16 -mamx-tile -mamx-bf16.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_kernels.h"
#include "simd/local_vector.h"

namespace ember::attention::kernels {
namespace {
// The vector types must come before the code that uses them: no include sorting here.
// clang-format off
#include "simd/simd_scalar.inl"
#include "simd/simd_avx512.inl"
#include "simd/simd_math.inl"
#include "simd/amx_tiles.inl"
#include "attention_mask.inl"
// clang-format on

using V = Avx512F;
constexpr int64_t kRowBytes = 64;    // a tile row: 16 floats or 32 bf16
constexpr int64_t kSoftmaxRows = 4;  // rows softmax_rows takes at once

// Every tile 16 rows of 64 bytes.
TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(kAmxTile);
    c.colsb[t] = static_cast<uint16_t>(kRowBytes);
  }
  return c;
}

__mmask32 first_elements(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << std::max<int64_t>(n, 0)) - 1);
}

// 32 bf16 of a row from element `from`, zero past `count` elements (the row's end) or for a missing row.
__m512i row_chunk(const uint16_t* row, int64_t from, int64_t count) {
  if (row == nullptr || from >= count) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi16(first_elements(count - from), row + from);
}

void pack_keys(const AttentionArgs& a, const PackedKeysValues& p, int64_t bg, int64_t block) {
  const int64_t b = bg / a.heads_kv, g = bg % a.heads_kv;
  const auto* k = static_cast<const uint16_t*>(a.k.data) + b * a.k.sb + g * a.k.sh;
  uint16_t* out = p.keys + bg * p.key_elements() + block * p.block_key_elements();
  // The tiles of the 64-key groups that hold keys: the scores read no others (a short last block leaves the rest).
  const int64_t keys = std::min(kAmxBlockK, a.len_k - block * kAmxBlockK);
  const int64_t tiles = (keys + kAmxKeyGroup - 1) / kAmxKeyGroup * (kAmxKeyGroup / kAmxTile);
  for (int64_t s = 0; s < p.dim_steps; ++s) {
    for (int64_t t = 0; t < tiles; ++t) {
      __m512 rows[16];  // key t·16 + c of the block: its feature pairs s·16 .. s·16 + 15
      for (int64_t c = 0; c < kAmxTile; ++c) {
        const int64_t key = block * kAmxBlockK + t * kAmxTile + c;
        const uint16_t* row = key < a.len_k ? k + key * a.k.sl : nullptr;
        rows[c] = _mm512_castsi512_ps(row_chunk(row, s * kAmxDepth, a.dim_qk));
      }
      Avx512F::transpose(rows);  // row r: feature pair s·16 + r of the 16 keys
      uint16_t* tile = out + (s * p.key_tiles + t) * kAmxTileElements;
      for (int64_t r = 0; r < kAmxTile; ++r) _mm512_storeu_ps(tile + r * kAmxDepth, rows[r]);
    }
  }
}

void pack_values(const AttentionArgs& a, const PackedKeysValues& p, int64_t bg, int64_t block) {
  const int64_t b = bg / a.heads_kv, g = bg % a.heads_kv;
  const auto* v = static_cast<const uint16_t*>(a.v.data) + b * a.v.sb + g * a.v.sh;
  uint16_t* out = p.values + bg * p.value_elements() + block * p.block_value_elements();
  // Element 2c of the low result is the first operand's c, 2c + 1 the second's; the high result takes c + 16.
  alignas(64) uint16_t lo_index[32], hi_index[32];
  for (int64_t c = 0; c < 16; ++c) {
    lo_index[2 * c] = static_cast<uint16_t>(c);
    lo_index[2 * c + 1] = static_cast<uint16_t>(32 + c);
    hi_index[2 * c] = static_cast<uint16_t>(16 + c);
    hi_index[2 * c + 1] = static_cast<uint16_t>(48 + c);
  }
  const __m512i lo = _mm512_load_si512(lo_index), hi = _mm512_load_si512(hi_index);
  // The steps that hold keys: the product with the probabilities reads no others.
  const int64_t steps = (std::min(kAmxBlockK, a.len_k - block * kAmxBlockK) + kAmxDepth - 1) / kAmxDepth;
  for (int64_t js = 0; js < steps; ++js) {
    for (int64_t r = 0; r < kAmxTile; ++r) {  // the pair of keys 2r, 2r + 1 of the step
      const int64_t key = block * kAmxBlockK + js * kAmxDepth + 2 * r;
      const uint16_t* first = key < a.len_k ? v + key * a.v.sl : nullptr;
      const uint16_t* second = key + 1 < a.len_k ? v + (key + 1) * a.v.sl : nullptr;
      for (int64_t ct = 0; ct < p.value_tiles; ct += 2) {  // 32 features: two tiles
        const __m512i x = row_chunk(first, ct * kAmxTile, a.dim_v), y = row_chunk(second, ct * kAmxTile, a.dim_v);
        uint16_t* tile = out + (js * p.value_tiles + ct) * kAmxTileElements + r * kAmxDepth;
        _mm512_storeu_si512(tile, _mm512_permutex2var_epi16(x, lo, y));
        if (ct + 1 < p.value_tiles) _mm512_storeu_si512(tile + kAmxTileElements, _mm512_permutex2var_epi16(x, hi, y));
      }
    }
  }
}

// The scores of 16 queries (A: q rows, `ld` elements apart) against the first `groups` 64-key groups of a block
// (`key_tiles` tiles a feature step), into s (rows kAmxBlockK floats apart): per group, C tiles 0-3 against its 4 key
// tiles.
void scores(const uint16_t* q, int64_t ld, const uint16_t* keys, int64_t key_tiles, int64_t dim_steps, int64_t groups,
            float* s) {
  const int64_t q_stride = ld * 2;
  constexpr int64_t s_stride = kAmxBlockK * 4;
  for (int64_t g = 0; g < groups; ++g) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t step = 0; step < dim_steps; ++step) {
      const uint16_t* tiles = keys + (step * key_tiles + g * (kAmxKeyGroup / kAmxTile)) * kAmxTileElements;
      _tile_loadd(4, q + step * kAmxDepth, q_stride);
      _tile_loadd(5, tiles, kRowBytes);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, tiles + kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, tiles + 2 * kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, tiles + 3 * kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(3, 4, 5);
    }
    float* out = s + g * kAmxKeyGroup;
    _tile_stored(0, out, s_stride);
    _tile_stored(1, out + kAmxTile, s_stride);
    _tile_stored(2, out + 2 * kAmxTile, s_stride);
    _tile_stored(3, out + 3 * kAmxTile, s_stride);
  }
}

// As scores, for 32 queries: two A tiles (16 queries each) by two key tiles into C tiles 0-3, so each tile loaded
// serves two multiplies, where the one-A form above loads a key tile for every multiply (the packed keys come from
// L2; a head's sequence of 1024 keys of 128 features: 2.07 -> 1.62 cycles a score for this step on the Xeon).
void scores_2x2(const uint16_t* q, int64_t ld, const uint16_t* keys, int64_t key_tiles, int64_t dim_steps,
                int64_t groups, float* s) {
  const int64_t q_stride = ld * 2;
  constexpr int64_t s_stride = kAmxBlockK * 4;
  const uint16_t* q_low = q + kAmxTile * ld;  // queries 16 .. 31
  float* s_low = s + kAmxTile * kAmxBlockK;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t half = 0; half < 2; ++half) {  // key tiles 2·half, 2·half + 1 of the group
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t step = 0; step < dim_steps; ++step) {
        const uint16_t* tiles = keys + (step * key_tiles + g * (kAmxKeyGroup / kAmxTile) + 2 * half) * kAmxTileElements;
        _tile_loadd(4, q + step * kAmxDepth, q_stride);
        _tile_loadd(6, tiles, kRowBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, tiles + kAmxTileElements, kRowBytes);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, q_low + step * kAmxDepth, q_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      const int64_t column = g * kAmxKeyGroup + half * 2 * kAmxTile;
      _tile_stored(0, s + column, s_stride);
      _tile_stored(1, s + column + kAmxTile, s_stride);
      _tile_stored(2, s_low + column, s_stride);
      _tile_stored(3, s_low + column + kAmxTile, s_stride);
    }
  }
}

// o[16 queries][Count feature tiles from `tile`] += p[16][keys] · the values' tiles. o rows `ldo` floats apart.
template <int Count>
void accumulate_values(const uint16_t* p, const uint16_t* values, int64_t value_tiles, int64_t steps, float* o,
                       int64_t ldo) {
  const int64_t o_stride = ldo * 4;
  _tile_loadd(0, o, o_stride);
  if constexpr (Count > 1) _tile_loadd(1, o + kAmxTile, o_stride);
  if constexpr (Count > 2) _tile_loadd(2, o + 2 * kAmxTile, o_stride);
  if constexpr (Count > 3) _tile_loadd(3, o + 3 * kAmxTile, o_stride);
  for (int64_t js = 0; js < steps; ++js) {
    const uint16_t* tiles = values + js * value_tiles * kAmxTileElements;
    _tile_loadd(4, p + js * kAmxDepth, kAmxBlockK * 2);
    _tile_loadd(5, tiles, kRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (Count > 1) {
      _tile_loadd(6, tiles + kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (Count > 2) {
      _tile_loadd(7, tiles + 2 * kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (Count > 3) {
      _tile_loadd(5, tiles + 3 * kAmxTileElements, kRowBytes);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, o, o_stride);
  if constexpr (Count > 1) _tile_stored(1, o + kAmxTile, o_stride);
  if constexpr (Count > 2) _tile_stored(2, o + 2 * kAmxTile, o_stride);
  if constexpr (Count > 3) _tile_stored(3, o + 3 * kAmxTile, o_stride);
}

// As accumulate_values, for 32 queries and two feature tiles: two probability tiles by two value tiles, so each value
// tile loaded serves two multiplies (BERT's, Whisper's and a Llama's head sizes: 15-20% off this step on the Xeon).
void accumulate_values_2x2(const uint16_t* p, const uint16_t* values, int64_t value_tiles, int64_t steps, float* o,
                           int64_t ldo) {
  const int64_t o_stride = ldo * 4;
  float* o_low = o + kAmxTile * ldo;  // queries 16 .. 31
  const uint16_t* p_low = p + kAmxTile * kAmxBlockK;
  _tile_loadd(0, o, o_stride);
  _tile_loadd(1, o + kAmxTile, o_stride);
  _tile_loadd(2, o_low, o_stride);
  _tile_loadd(3, o_low + kAmxTile, o_stride);
  for (int64_t js = 0; js < steps; ++js) {
    const uint16_t* tiles = values + js * value_tiles * kAmxTileElements;
    _tile_loadd(4, p + js * kAmxDepth, kAmxBlockK * 2);
    _tile_loadd(6, tiles, kRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, tiles + kAmxTileElements, kRowBytes);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, p_low + js * kAmxDepth, kAmxBlockK * 2);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, o, o_stride);
  _tile_stored(1, o + kAmxTile, o_stride);
  _tile_stored(2, o_low, o_stride);
  _tile_stored(3, o_low + kAmxTile, o_stride);
}

// The mask of one query row for keys k0 .. k0 + keys as values to add (a kept key 0, a masked one -inf for a bool
// mask), into add[0 .. keys).
void mask_values(const AttentionArgs& a, const char* row, int64_t k0, int64_t keys, float* add) {
  if (a.mask_sj == 1) {  // a row of the mask in a row of memory: 16 keys a step, the tail by a masked load
    for (int64_t j = 0; j < keys; j += 16) {
      const auto lanes = static_cast<__mmask16>((1U << std::min<int64_t>(16, keys - j)) - 1);
      __m512 v;
      if (a.mask_kind == MaskKind::additive_f32) {
        v = _mm512_maskz_loadu_ps(lanes, reinterpret_cast<const float*>(row) + k0 + j);
      } else if (a.mask_kind == MaskKind::additive_bf16) {
        const __m256i half = _mm256_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(row) + k0 + j);
        v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
      } else {
        const __m128i bytes = _mm_maskz_loadu_epi8(lanes, reinterpret_cast<const uint8_t*>(row) + k0 + j);
        v = _mm512_mask_blend_ps(_mm_test_epi8_mask(bytes, bytes), V::set1(kNegInf), V::set1(0.0f));
      }
      _mm512_mask_storeu_ps(add + j, lanes, v);
    }
    return;
  }
  for (int64_t j = 0; j < keys; ++j) add[j] = mask_value(a, row, k0 + j);
}

// e^x for x <= 0 as the bf16 probabilities need it: simd_math::exp_nonpositive's reduction to r in
// [-ln2/2, ln2/2], then a degree-4 polynomial (a minimax fit of e^r made for ember: relative error 3.1e-6, where the
// probabilities round to bf16 at 2^-9 and their fp32 sum at 6e-8 a term) instead of the Taylor series to r^6; and
// the floor with one vmaxps whose second operand is x (maxps returns its second operand when either is NaN, so NaN
// stays NaN without torch.maximum's compare and add). Below -87.3 exactly 0 (a masked key, -inf, adds nothing).
inline __m512 probability_exp(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.3f);
  const __m512 c = _mm512_max_ps(floor, x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(simd_math::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-simd_math::kLn2Hi), c);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-simd_math::kLn2Lo), r);
  __m512 poly = _mm512_set1_ps(0.04158984f);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.16790617f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.50002222f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.99996366f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.0f));
  return _mm512_mask_mov_ps(_mm512_scalef_ps(poly, n), _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ), _mm512_setzero_ps());
}

// Rows r = 0 .. R - 1 of a block of scores (row r at s + r·kAmxBlockK), over their first `span` keys (the block's
// keys rounded up to a tile's depth, which is what the product with the values reads): scaled, plus the mask's
// values (add[r]; Masked only), keys from valid[r] on masked (the block's end or the causal bound), then the running
// softmax as attention_body.inl's softmax_block does it, row by row. The probabilities go to p + r·kAmxBlockK in
// bf16. The scaling, the masking and the maximum are one pass. Each row's maximum and sum end in a reduction across
// lanes whose latency one row alone leaves exposed: four rows interleaved keep the vector units busy (Whisper's
// encoder heads, one thread on the Xeon: 1.05 -> 0.84 cycles a score for this step), each row's arithmetic and its
// order the same as alone.
template <int R, bool Masked>
void softmax_rows(const AttentionArgs& a, float* s, int64_t span, const int64_t* valid, const float* const* add,
                  float* m, float* l, float* alpha, uint16_t* p) {
  const auto scale = V::set1(a.scale);
  const auto masked = V::set1(kNegInf);
  // Unmasked rows that keep every key of the span, with a scale in (0, 1] (where no finite score overflows when
  // scaled), need no scaled copy of their scores: the maximum of the scaled scores is the scale times the raw
  // maximum (rounding keeps the order), and the exponent takes the scaling in one fmadd, which saves a store and a
  // load of every score (the rows of Whisper's encoder, all but each head's last block).
  bool raw = !Masked && a.scale > 0.0f && a.scale <= 1.0f && a.softcap == 0.0f;
  const auto cap = V::set1(a.softcap), inverse = V::set1(a.softcap > 0.0f ? 1.0f / a.softcap : 0.0f);
  for (int r = 0; r < R; ++r) raw = raw && valid[r] >= span;
  __m512 top[R];
  for (int r = 0; r < R; ++r) top[r] = masked;
  if (raw) {
    for (int64_t j = 0; j < span; j += 16) {
      for (int r = 0; r < R; ++r) top[r] = V::max(top[r], V::load(s + r * kAmxBlockK + j));  // NaN-propagating
    }
    for (int r = 0; r < R; ++r) top[r] = V::mul(top[r], scale);
  } else {
    for (int64_t j = 0; j < span; j += 16) {
      for (int r = 0; r < R; ++r) {
        float* row = s + r * kAmxBlockK;
        __m512 x;
        if (a.softcap > 0.0f) {  // scaled, capped (softcap · tanh(x / softcap)), then masked
          x = V::mul(cap, simd_math::tanh<V>(V::mul(V::mul(V::load(row + j), scale), inverse)));
          if constexpr (Masked) x = V::add(x, V::load(add[r] + j));
        } else if constexpr (Masked) {
          x = V::fmadd(V::load(row + j), scale, V::load(add[r] + j));
        } else {
          x = V::mul(V::load(row + j), scale);
        }
        const int64_t left = valid[r] - j;
        if (left < 16) {
          const auto kept = static_cast<__mmask16>(left <= 0 ? 0U : (1U << left) - 1);
          x = _mm512_mask_blend_ps(kept, masked, x);
        }
        V::store(row + j, x);
        top[r] = V::max(top[r], x);  // NaN-propagating
      }
    }
  }
  __m512 pivot[R];
  float m_new[R];
  for (int r = 0; r < R; ++r) {
    const bool nan = V::is_nan(top[r]) != 0;
    m_new[r] = nan ? __builtin_nanf("") : std::max(m[r], _mm512_reduce_max_ps(top[r]));  // m NaN stays NaN
    // A row masked so far keeps m = -inf and takes its exponents against 0 (probabilities 0), as the body does.
    pivot[r] = V::set1(m_new[r] < kLowest ? 0.0f : m_new[r]);
  }
  __m512 sum[R];
  for (int r = 0; r < R; ++r) sum[r] = V::set1(0.0f);
  for (int64_t j = 0; j < span; j += 16) {
    for (int r = 0; r < R; ++r) {
      const __m512 x = V::load(s + r * kAmxBlockK + j);
      const __m512 e = probability_exp(raw ? V::fmadd(x, scale, V::neg(pivot[r])) : V::sub(x, pivot[r]));
      sum[r] = V::add(sum[r], e);
      // Rounded to bf16 (to nearest even) for the tile multiply.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + r * kAmxBlockK + j),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
    }
  }
  for (int r = 0; r < R; ++r) {
    alpha[r] = simd_math::exp<ScalarF>(m[r] - (m_new[r] < kLowest ? 0.0f : m_new[r]));
    // One rounding, written out: a contraction the compiler chose per instantiation would make a row's sum depend
    // on how many rows it was computed with, and so on the thread count (which sizes the query blocks).
    l[r] = std::fma(l[r], alpha[r], _mm512_reduce_add_ps(sum[r]));
    m[r] = m_new[r];
  }
}

// softmax_rows for `count` (1 to kSoftmaxRows) rows.
template <bool Masked>
void softmax_some_rows(int64_t count, const AttentionArgs& a, float* s, int64_t span, const int64_t* valid,
                       const float* const* add, float* m, float* l, float* alpha, uint16_t* p) {
  if (count == kSoftmaxRows) {
    softmax_rows<kSoftmaxRows, Masked>(a, s, span, valid, add, m, l, alpha, p);
    return;
  }
  for (int64_t r = 0; r < count; ++r) {
    softmax_rows<1, Masked>(a, s + r * kAmxBlockK, span, valid + r, add + r, m + r, l + r, alpha + r,
                            p + r * kAmxBlockK);
  }
}

template <typename Fn>
void with_value_groups(int64_t tiles, Fn&& fn) {
  for (int64_t ct = 0; ct < tiles; ct += 4) fn(ct, std::min<int64_t>(4, tiles - ct));
}

void run_task(const AttentionArgs& a, const PackedKeysValues& packed, int64_t task, simd::LocalVector<float>& scratch,
              simd::LocalVector<uint16_t>& scratch16) {
  const int64_t blocks = (a.len_q + a.block_q - 1) / a.block_q;
  const int64_t block = task % blocks, bh = task / blocks;
  const int64_t h = bh % a.heads_q, b = bh / a.heads_q, g = h / (a.heads_q / a.heads_kv), bg = b * a.heads_kv + g;
  const int64_t q0 = block * a.block_q, rows = std::min(a.block_q, a.len_q - q0);
  const int64_t rows_pad = (rows + kAmxTile - 1) / kAmxTile * kAmxTile;
  const int64_t ldq = packed.dim_steps * kAmxDepth, ldo = packed.value_tiles * kAmxTile;

  const auto need =
      static_cast<size_t>(rows_pad * kAmxBlockK + rows_pad * ldo + 3 * rows_pad + kSoftmaxRows * kAmxBlockK);
  const auto need16 = static_cast<size_t>(rows_pad * ldq + rows_pad * kAmxBlockK);
  if (scratch.size() < need) scratch.resize(need);
  if (scratch16.size() < need16) scratch16.resize(need16);
  float* s = scratch.data();
  float* o = s + rows_pad * kAmxBlockK;
  float* m = o + rows_pad * ldo;
  float* l = m + rows_pad;
  float* alpha = l + rows_pad;
  // The mask's values for each row softmax_rows takes at once (or for all rows, where it broadcasts over queries).
  float* add = alpha + rows_pad;
  std::fill(add, add + kSoftmaxRows * kAmxBlockK, 0.0f);
  uint16_t* qa = scratch16.data();
  uint16_t* p = qa + rows_pad * ldq;

  const auto* q = static_cast<const uint16_t*>(a.q.data) + b * a.q.sb + h * a.q.sh + q0 * a.q.sl;
  for (int64_t i = 0; i < rows_pad; ++i) {
    for (int64_t step = 0; step < packed.dim_steps; ++step) {
      const __m512i chunk = row_chunk(i < rows ? q + i * a.q.sl : nullptr, step * kAmxDepth, a.dim_qk);
      _mm512_storeu_si512(qa + i * ldq + step * kAmxDepth, chunk);
    }
  }
  std::fill(o, o + rows_pad * ldo, 0.0f);
  std::fill(m, m + rows_pad, kNegInf);
  std::fill(l, l + rows_pad, 0.0f);

  const char* mask_head = nullptr;
  int64_t element = 0;
  if (a.mask_kind != MaskKind::none) {
    element = mask_element_bytes(a.mask_kind);
    mask_head = static_cast<const char*>(a.mask) + (b * a.mask_sb + h * a.mask_sh) * element;
  }
  const uint16_t* keys_head = packed.keys + bg * packed.key_elements();
  const uint16_t* values_head = packed.values + bg * packed.value_elements();
  const int64_t key_end = a.causal ? std::min(a.len_k, q0 + rows) : a.len_k;
  // Rows past `rows` stay zero where the products with the values read them (the softmax writes the others' spans
  // each block): they add nothing to o.
  const int64_t read_columns = std::min(kAmxBlockK, (key_end + kAmxDepth - 1) / kAmxDepth * kAmxDepth);
  for (int64_t i = rows; i < rows_pad; ++i) std::fill_n(p + i * kAmxBlockK, read_columns, uint16_t{0});

  load_config(full_tiles());
  for (int64_t kb = 0; kb * kAmxBlockK < key_end; ++kb) {
    const int64_t k0 = kb * kAmxBlockK, keys = std::min(kAmxBlockK, key_end - k0);
    const int64_t span = (keys + kAmxDepth - 1) / kAmxDepth * kAmxDepth;
    const int64_t groups = (keys + kAmxKeyGroup - 1) / kAmxKeyGroup;
    const uint16_t* key_tiles = keys_head + kb * packed.block_key_elements();
    int64_t rt = 0;
    for (; rt + 2 * kAmxTile <= rows_pad; rt += 2 * kAmxTile) {
      scores_2x2(qa + rt * ldq, ldq, key_tiles, packed.key_tiles, packed.dim_steps, groups, s + rt * kAmxBlockK);
    }
    for (; rt < rows_pad; rt += kAmxTile) {
      scores(qa + rt * ldq, ldq, key_tiles, packed.key_tiles, packed.dim_steps, groups, s + rt * kAmxBlockK);
    }
    // A mask of one row for all queries is read once a block; one of a row per query, per row into its own buffer.
    const bool row_masks = mask_head != nullptr && a.mask_si != 0;
    if (mask_head != nullptr && !row_masks) mask_values(a, mask_head, k0, keys, add);
    for (int64_t i = 0; i < rows; i += kSoftmaxRows) {
      const int64_t count = std::min(kSoftmaxRows, rows - i);
      int64_t valid[kSoftmaxRows];
      const float* adds[kSoftmaxRows];
      for (int64_t r = 0; r < count; ++r) {
        const int64_t limit = a.causal ? q0 + i + r - k0 + 1 : kAmxBlockK;  // keys before this bound are visible
        valid[r] = std::max<int64_t>(std::min(keys, limit), 0);
        adds[r] = row_masks ? add + r * kAmxBlockK : add;
        if (row_masks) mask_values(a, mask_head + (q0 + i + r) * a.mask_si * element, k0, keys, add + r * kAmxBlockK);
      }
      float* rows_s = s + i * kAmxBlockK;
      uint16_t* rows_p = p + i * kAmxBlockK;
      if (mask_head != nullptr) {
        softmax_some_rows<true>(count, a, rows_s, span, valid, adds, m + i, l + i, alpha + i, rows_p);
      } else {
        softmax_some_rows<false>(count, a, rows_s, span, valid, adds, m + i, l + i, alpha + i, rows_p);
      }
      for (int64_t r = i; r < i + count; ++r) {
        if (alpha[r] == 1.0f) continue;
        const auto f = V::set1(alpha[r]);
        for (int64_t c = 0; c < ldo; c += 16) V::store(o + r * ldo + c, V::mul(V::load(o + r * ldo + c), f));
      }
    }
    const int64_t steps = (keys + kAmxDepth - 1) / kAmxDepth;
    const uint16_t* value_tiles = values_head + kb * packed.block_value_elements();
    rt = 0;
    for (; rt + 2 * kAmxTile <= rows_pad; rt += 2 * kAmxTile) {  // 32 queries: two feature tiles at a time
      const uint16_t* pv = p + rt * kAmxBlockK;
      float* ot = o + rt * ldo;
      int64_t ct = 0;
      for (; ct + 2 <= packed.value_tiles; ct += 2) {
        accumulate_values_2x2(pv, value_tiles + ct * kAmxTileElements, packed.value_tiles, steps, ot + ct * kAmxTile,
                              ldo);
      }
      if (ct < packed.value_tiles) {  // an odd last feature tile, for each half
        const uint16_t* vt = value_tiles + ct * kAmxTileElements;
        accumulate_values<1>(pv, vt, packed.value_tiles, steps, ot + ct * kAmxTile, ldo);
        accumulate_values<1>(pv + kAmxTile * kAmxBlockK, vt, packed.value_tiles, steps,
                             ot + kAmxTile * ldo + ct * kAmxTile, ldo);
      }
    }
    for (; rt < rows_pad; rt += kAmxTile) {
      with_value_groups(packed.value_tiles, [&](int64_t ct, int64_t count) {
        const uint16_t* pv = p + rt * kAmxBlockK;
        const uint16_t* vt = value_tiles + ct * kAmxTileElements;
        float* ot = o + rt * ldo + ct * kAmxTile;
        switch (count) {
          case 4: accumulate_values<4>(pv, vt, packed.value_tiles, steps, ot, ldo); break;
          case 3: accumulate_values<3>(pv, vt, packed.value_tiles, steps, ot, ldo); break;
          case 2: accumulate_values<2>(pv, vt, packed.value_tiles, steps, ot, ldo); break;
          default: accumulate_values<1>(pv, vt, packed.value_tiles, steps, ot, ldo); break;
        }
      });
    }
  }
  _tile_release();

  auto* out = static_cast<uint16_t*>(a.out.data) + b * a.out.sb + h * a.out.sh + q0 * a.out.sl;
  for (int64_t i = 0; i < rows; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : (l[i] == 0.0f ? 0.0f : l[i]);
    const auto f = V::set1(inv);
    uint16_t* row = out + i * a.out.sl;
    int64_t c = 0;
    for (; c + 16 <= a.dim_v; c += 16) V::store(row + c, V::mul(V::load(o + i * ldo + c), f));
    for (; c < a.dim_v; ++c) ScalarF::store(row + c, o[i * ldo + c] * inv);
  }
}

}  // namespace

void pack_keys_values_amx(const AttentionArgs& a, const PackedKeysValues& packed, int64_t begin, int64_t end) {
  for (int64_t item = begin; item < end; ++item) {
    const int64_t bg = item / packed.blocks, block = item % packed.blocks;
    pack_keys(a, packed, bg, block);
    pack_values(a, packed, bg, block);
  }
}

void attention_tasks_amx(const AttentionArgs& a, const PackedKeysValues& packed, int64_t task_begin, int64_t task_end) {
  simd::LocalVector<float> scratch;
  simd::LocalVector<uint16_t> scratch16;
  for (int64_t t = task_begin; t < task_end; ++t) run_task(a, packed, t, scratch, scratch16);
}

}  // namespace ember::attention::kernels
