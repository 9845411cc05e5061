// The bf16 attention task on AVX512-BF16 without AMX (the avx512_bf16 compilation of attention_kernels.cpp, after
// attention_body.inl, whose softmax, masks and tile sizes it shares). Both products run on vdpbf16ps, which
// multiplies pairs of bf16 and adds both products to a float32 lane: twice the multiply-adds of an FMA on widened
// floats, and no widening of keys and values. The layout the instruction wants, one pair per 32-bit lane:
//
// - scores St[j][i] = scale · sum_e k[j][e] · q[i][e]: pairs along e. A key row already is its pairs (two adjacent
//   bf16 are one 32-bit word), broadcast one pair at a time; the queries are packed transposed in pairs,
//   Qp[e/2][i] = (q[i][e], q[i][e+1]), without the scale (applied to the float32 sums, so q is not rounded again);
// - values O[i][:] += sum_j P[j][i] · v[j][:]: pairs along j. The probabilities are rounded to bf16 in pairs of
//   keys, Pp[j/2][i] = (p[j][i], p[j+1][i]) (as the AMX path and torch's kernels round them), and each pair of value
//   rows is interleaved, Vp[j/2][c] = (v[j][c], v[j+1][c]).
//
// vdpbf16ps treats denormal inputs as zero and flushes denormal results, which changes nothing at the tolerance
// of a bf16 attention. An odd feature or key count is padded with a zero.

// Two rows of 16 bf16 each into 16 lanes of pairs: lane c = a[c] | b[c] << 16 (b null: zeros).
inline __m512i interleave_pairs(const uint16_t* a, const uint16_t* b) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  if (b == nullptr) return lo;
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// Two rows of 16 floats rounded to bf16 (round to nearest even) into 16 lanes of pairs, as interleave_pairs.
inline __m512i round_pairs(__m512 a, __m512 b) {
  const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a)));
  const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(b)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

// qp[e2][i] = (q[i][2·e2], q[i][2·e2 + 1]) for i < rows, zero for rows <= i < ld and past the features.
void pack_query_pairs(const uint16_t* q, int64_t stride, int64_t rows, int64_t dim, uint32_t* qp, int64_t ld) {
  const int64_t pairs = (dim + 1) / 2;
  for (int64_t e2 = 0; e2 < pairs; ++e2) {
    uint32_t* d = qp + e2 * ld;
    const int64_t e = 2 * e2;
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* row = q + i * stride;
      d[i] = uint32_t{row[e]} | (e + 1 < dim ? uint32_t{row[e + 1]} << 16 : 0u);
    }
    for (int64_t i = rows; i < ld; ++i) d[i] = 0;
  }
}

// Two adjacent bf16 as one 32-bit pair (an unaligned load).
inline uint32_t load_pair(const uint16_t* p) {
  uint32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return pair;
}

// The key rows score_pairs reads, rows[j] for j < keys_pad: k's own rows where the features are an even count (each
// pair already two adjacent bf16), else copies with a zero feature appended; `zeros` past the keys.
void key_rows(const uint16_t* k, int64_t stride, int64_t keys, int64_t dim, int64_t keys_pad, uint16_t* copies,
              const uint16_t* zeros, const uint16_t** rows) {
  for (int64_t j = 0; j < keys; ++j) {
    const uint16_t* row = k + j * stride;
    if (dim % 2 == 0) {
      rows[j] = row;
    } else {
      uint16_t* copy = copies + j * (dim + 1);
      std::copy(row, row + dim, copy);
      copy[dim] = 0;
      rows[j] = copy;
    }
  }
  for (int64_t j = keys; j < keys_pad; ++j) rows[j] = zeros;
}

// vp[j2][c] = (v[2·j2][c], v[2·j2 + 1][c]) for c < dim, zero for dim <= c < ldv and for the missing key of an odd
// count.
void pack_value_pairs(const uint16_t* v, int64_t stride, int64_t keys, int64_t dim, uint32_t* vp, int64_t ldv) {
  for (int64_t j2 = 0; 2 * j2 < keys; ++j2) {
    const uint16_t* a = v + 2 * j2 * stride;
    const uint16_t* b = 2 * j2 + 1 < keys ? a + stride : nullptr;
    uint32_t* d = vp + j2 * ldv;
    int64_t c = 0;
    for (; c + kW <= dim; c += kW) _mm512_storeu_si512(d + c, interleave_pairs(a + c, b == nullptr ? nullptr : b + c));
    for (; c < dim; ++c) d[c] = uint32_t{a[c]} | (b != nullptr ? uint32_t{b[c]} << 16 : 0u);
    for (; c < ldv; ++c) d[c] = 0;
  }
}

// st[j][i] = scale · sum_e2 rows[j][e2 pair] · qp[e2][i] + the block's mask, for j < keys_pad (a multiple of
// kTileRows), i < ld (of kTileCols); with `top`, also its maximum over the first `keys` rows (tile_maximum).
void score_pairs(const uint16_t* const* rows, int64_t keys_pad, int64_t keys, int64_t pairs, const uint32_t* qp,
                 int64_t ld, float scale, const BlockMask& mask, float softcap, float* st, float* top) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < keys_pad; j0 += kTileRows) {
    for (int64_t i0 = 0; i0 < ld; i0 += kTileCols) {
      __m512 acc[kTileRows][kTileVecs];
      for (auto& row : acc) {
        for (auto& a : row) a = _mm512_setzero_ps();
      }
      for (int64_t e2 = 0; e2 < pairs; ++e2) {
        __m512i qv[kTileVecs];
        for (int64_t c = 0; c < kTileVecs; ++c) qv[c] = _mm512_loadu_si512(qp + e2 * ld + i0 + c * kW);
        for (int64_t r = 0; r < kTileRows; ++r) {
          const __m512i kb = _mm512_set1_epi32(static_cast<int>(load_pair(rows[j0 + r] + 2 * e2)));
          for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = dot_pairs(acc[r][c], kb, qv[c]);
        }
      }
      for (auto& row : acc) {
        for (auto& a : row) a = _mm512_mul_ps(a, scale_v);
      }
      if (softcap > 0.0f) soft_cap_tile(acc, softcap);
      add_block_mask(acc, mask, j0, i0);
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) _mm512_storeu_ps(st + (j0 + r) * ld + i0 + c * kW, acc[r][c]);
      }
      if (top != nullptr) tile_maximum(acc, keys - j0, top + i0);
    }
  }
}

// pp[j2][i] = (p[2·j2][i], p[2·j2 + 1][i]) rounded to bf16, for j2 < ceil(keys / 2), i < ld (the missing key of an
// odd count zero).
void round_probability_pairs(const float* st, int64_t ld, int64_t keys, uint32_t* pp) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j2 = 0; 2 * j2 < keys; ++j2) {
    const float* a = st + 2 * j2 * ld;
    const float* b = 2 * j2 + 1 < keys ? a + ld : nullptr;
    for (int64_t i = 0; i < ld; i += kW) {
      _mm512_storeu_si512(pp + j2 * ld + i,
                          round_pairs(_mm512_loadu_ps(a + i), b != nullptr ? _mm512_loadu_ps(b + i) : zero));
    }
  }
}

// o[i][:] += sum_j2 pp[j2][i] · vp[j2][:] for i < rows_pad (a multiple of kTileRows), o and vp `ldv` wide (a
// multiple of kTileCols).
void accumulate_value_pairs(const uint32_t* pp, int64_t ld, int64_t rows_pad, int64_t key_pairs, const uint32_t* vp,
                            int64_t ldv, float* o) {
  for (int64_t i0 = 0; i0 < rows_pad; i0 += kTileRows) {
    for (int64_t c0 = 0; c0 < ldv; c0 += kTileCols) {
      __m512 acc[kTileRows][kTileVecs];
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = _mm512_loadu_ps(o + (i0 + r) * ldv + c0 + c * kW);
      }
      for (int64_t j2 = 0; j2 < key_pairs; ++j2) {
        __m512i vv[kTileVecs];
        for (int64_t c = 0; c < kTileVecs; ++c) vv[c] = _mm512_loadu_si512(vp + j2 * ldv + c0 + c * kW);
        for (int64_t r = 0; r < kTileRows; ++r) {
          const __m512i pb = _mm512_set1_epi32(static_cast<int>(pp[j2 * ld + i0 + r]));
          for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = dot_pairs(acc[r][c], pb, vv[c]);
        }
      }
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) _mm512_storeu_ps(o + (i0 + r) * ldv + c0 + c * kW, acc[r][c]);
      }
    }
  }
}

// run_task's bf16 task on the pair products: the same blocks, masks, running softmax and output.
void run_task_pairs(const AttentionArgs& a, int64_t task, simd::LocalVector<float>& scratch) {
  const int64_t blocks = (a.len_q + a.block_q - 1) / a.block_q;
  const int64_t block = task % blocks, bh = task / blocks;
  const int64_t h = bh % a.heads_q, b = bh / a.heads_q, g = h / (a.heads_q / a.heads_kv);
  const int64_t q0 = block * a.block_q, rows = std::min(a.block_q, a.len_q - q0);
  const int64_t ld = round_up(rows, std::max(kTileCols, kTileRows));
  const int64_t ldv = round_up(a.dim_v, kTileCols);
  const int64_t keys_pad = round_up(kBlockK, kTileRows);
  const int64_t pairs = (a.dim_qk + 1) / 2;

  // One float-sized slot per 32-bit pair as well: qp, the key copies and a zero row (pairs each), st, the block's
  // mask, pp, vp, o, m, l, alpha, top.
  const size_t need = static_cast<size_t>(pairs * ld + (keys_pad + 1) * pairs + 2 * keys_pad * ld + keys_pad / 2 * ld +
                                          keys_pad / 2 * ldv + ld * ldv + 4 * ld);
  if (scratch.size() < need) scratch.resize(need);
  auto* qp = reinterpret_cast<uint32_t*>(scratch.data());
  uint32_t* copies = qp + pairs * ld;
  uint32_t* zeros = copies + keys_pad * pairs;
  std::fill(zeros, zeros + pairs, 0u);
  auto* st = reinterpret_cast<float*>(zeros + pairs);
  float* mt = st + keys_pad * ld;
  auto* pp = reinterpret_cast<uint32_t*>(mt + keys_pad * ld);
  uint32_t* vp = pp + keys_pad / 2 * ld;
  auto* o = reinterpret_cast<float*>(vp + keys_pad / 2 * ldv);
  float* m = o + ld * ldv;
  float* l = m + ld;
  float* alpha = l + ld;
  float* top = alpha + ld;

  const auto* q = static_cast<const uint16_t*>(a.q.data) + b * a.q.sb + h * a.q.sh + q0 * a.q.sl;
  const auto* k = static_cast<const uint16_t*>(a.k.data) + b * a.k.sb + g * a.k.sh;
  const auto* v = static_cast<const uint16_t*>(a.v.data) + b * a.v.sb + g * a.v.sh;
  pack_query_pairs(q, a.q.sl, rows, a.dim_qk, qp, ld);
  std::fill(o, o + ld * ldv, 0.0f);
  std::fill(m, m + ld, kNegInf);
  std::fill(l, l + ld, 0.0f);

  const uint16_t* key_row[round_up(kBlockK, kTileRows)];
  const int64_t key_end = a.causal ? std::min(a.len_k, q0 + rows) : a.len_k;
  for (int64_t k0 = 0; k0 < key_end; k0 += kBlockK) {
    const int64_t keys = std::min(kBlockK, key_end - k0);
    const int64_t keys_tile = round_up(keys, kTileRows);
    key_rows(k + k0 * a.k.sl, a.k.sl, keys, a.dim_qk, keys_tile, reinterpret_cast<uint16_t*>(copies),
             reinterpret_cast<const uint16_t*>(zeros), key_row);
    const bool maximum = maximum_in_scores(a, q0, k0, keys);
    if (maximum) std::fill(top, top + ld, kNegInf);
    const BlockMask mask = block_mask(a, b, h, q0, rows, k0, keys, keys_tile, ld, mt);
    score_pairs(key_row, keys_tile, keys, pairs, qp, ld, a.scale, mask, a.softcap, st, maximum ? top : nullptr);
    apply_causal(a, q0, k0, keys, st, ld);
    softmax_block(st, ld, keys, m, l, alpha, maximum ? top : nullptr);
    rescale_outputs(alpha, ld, o, ldv);
    round_probability_pairs(st, ld, keys, pp);
    pack_value_pairs(v + k0 * a.v.sl, a.v.sl, keys, a.dim_v, vp, ldv);
    accumulate_value_pairs(pp, ld, round_up(rows, kTileRows), (keys + 1) / 2, vp, ldv, o);
  }

  store_outputs(o, ldv, l, rows, a.dim_v,
                static_cast<uint16_t*>(a.out.data) + b * a.out.sb + h * a.out.sh + q0 * a.out.sl, a.out.sl);
}

void attention_tasks_pairs(const AttentionArgs& a, int64_t task_begin, int64_t task_end) {
  if (!a.q.bf16) {
    attention_tasks(a, task_begin, task_end);
    return;
  }
  simd::LocalVector<float> scratch;
  for (int64_t t = task_begin; t < task_end; ++t) run_task_pairs(a, t, scratch);
}
