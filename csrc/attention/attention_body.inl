// Scaled dot-product attention (ember/attention.h), written once for the file's float vector type V (`using V =
// ...` before inclusion, inside a namespace of attention_kernels.cpp, once per ISA, after the vector types).
// Storage types are float or uint16_t (bfloat16 bits); arithmetic is float throughout.
//
// A task is one block of query rows of one (batch, head). Its queries lie along the vector lanes: the block is
// packed once, transposed and scaled, as Qt[e][i] = scale · q[i][e], and every block of keys then gives the
// transposed scores St[j][i] = sum_e k[j][e] · Qt[e][i] by broadcasting one key element against vectors of
// queries (no per-key-block transpose, the block's dominant cost otherwise). The softmax statistics, a maximum
// and a sum per query, are then vectors as well, and the output O[i][:] += sum_j St[j][i] · v[j][:] broadcasts
// one probability against vectors of a value row. Keys and values are widened to float32 rows once per block.
using L = Lane<V>;

constexpr int64_t kW = V::kWidth;
// The register tile of both products: kTileRows broadcast operands against kTileVecs vectors, kTileRows ·
// kTileVecs sums in registers (16 of AVX-512's 32, 8 of AVX2's 16).
constexpr int64_t kTileRows = kW >= 16 ? 8 : 4;
constexpr int64_t kTileVecs = 2;
constexpr int64_t kTileCols = kTileVecs * kW;

constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// dst[r][c] = src[r][c] (widened) for r < rows, c < cols; columns cols..ld and rows rows..rows_pad are zero.
template <typename T>
void pack_rows(const T* src, int64_t stride, int64_t rows, int64_t cols, float* dst, int64_t ld, int64_t rows_pad) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * stride;
    float* d = dst + r * ld;
    int64_t c = 0;
    for (; c + kW <= cols; c += kW) V::store(d + c, V::load(s + c));
    for (; c < cols; ++c) d[c] = L::load(s + c);
    for (; c < ld; ++c) d[c] = 0.0f;
  }
  for (int64_t r = rows; r < rows_pad; ++r) {
    for (int64_t c = 0; c < ld; ++c) dst[r * ld + c] = 0.0f;
  }
}

// qt[e][i] = scale · q[i][e] for i < rows, zero for rows <= i < ld.
template <typename T>
void pack_queries_transposed(const T* q, int64_t stride, int64_t rows, int64_t dim, float scale, float* qt,
                             int64_t ld) {
  for (int64_t e = 0; e < dim; ++e) {
    float* d = qt + e * ld;
    for (int64_t i = 0; i < rows; ++i) d[i] = L::load(q + i * stride + e) * scale;
    for (int64_t i = rows; i < ld; ++i) d[i] = 0.0f;
  }
}

// The scores' maximum per query as a score tile leaves the registers (softmax_block then skips its pass over the
// block for it): top[i0 + c·kW ...] = max(top, tile[r][c]) over the tile's first `valid` rows, the keys that are
// not padding. (Not where the causal triangle is applied after the scores: see maximum_in_scores.)
void tile_maximum(const typename V::Reg (&tile)[kTileRows][kTileVecs], int64_t valid, float* top) {
  for (int64_t c = 0; c < kTileVecs; ++c) {
    auto mx = V::load(top + c * kW);
    for (int64_t r = 0; r < kTileRows && r < valid; ++r) mx = V::max(mx, tile[r][c]);
    V::store(top + c * kW, mx);
  }
}

// Whether the scores' pass can take each query's maximum over this block: the causal triangle, applied after the
// scores, leaves every key of the block (each at or before the block's first query). A mask is added in that pass.
bool maximum_in_scores(const AttentionArgs& a, int64_t q0, int64_t k0, int64_t keys) {
  return !a.causal || k0 + keys - 1 <= q0;
}

// The mask of one block of keys, as the scores' pass adds it to each tile leaving the registers: none (`add` null),
// one value per key for every query (`add[j]`, `ld` 0: a padding mask), or one per key and query, transposed to the
// scores' layout (`add[j * ld + i]`). Added there rather than in a pass of its own over the scores, it costs no
// load and store of each score, and the pass still takes the block's maximum. On the 2-core Zen 5, bf16, 16 x 12
// heads of 128 x 128 x 64, over the same call without a mask: a padding mask 20% -> 3% more time, a mask per query
// and key 45% -> 16%; Swin's windows (1024 x 3 heads of 49 x 49 x 32) 13% -> none and 41% -> 17%.
struct BlockMask {
  const float* add = nullptr;
  int64_t ld = 0;
};

// mt[j][i] = the mask of query q0 + i and key k0 + j, for j < keys and i < rows; zero for the padding rows and
// columns up to keys_tile and ld, which the scores' tiles cover. An additive mask whose keys lie contiguous goes in
// whole kW x kW blocks, kW rows loaded and transposed in registers (Swin's windows with a mask per query and key,
// bf16 on the Zen 5: 6904 -> 5617 us a call against element by element); the rest, and a bool mask, element by
// element.
template <MaskKind Kind>
void transpose_mask_rows(const char* head, int64_t row_bytes, int64_t key_stride, int64_t q0, int64_t rows, int64_t k0,
                         int64_t keys, int64_t keys_tile, float* mt, int64_t ld) {
  int64_t rows_vec = 0, keys_vec = 0;
  if constexpr (Kind != MaskKind::keep_bool) {
    using T = std::conditional_t<Kind == MaskKind::additive_f32, float, uint16_t>;
    if (key_stride == 1) {
      rows_vec = rows / kW * kW;
      keys_vec = keys / kW * kW;
    }
    for (int64_t j0 = 0; j0 < keys_vec; j0 += kW) {
      for (int64_t i0 = 0; i0 < rows_vec; i0 += kW) {
        typename V::Reg block[kW];
        for (int64_t r = 0; r < kW; ++r) {
          block[r] = V::load(reinterpret_cast<const T*>(head + (q0 + i0 + r) * row_bytes) + k0 + j0);
        }
        V::transpose(block);
        for (int64_t t = 0; t < kW; ++t) V::store(mt + (j0 + t) * ld + i0, block[t]);
      }
    }
  }
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t at = (k0 + j) * key_stride;
    float* d = mt + j * ld;
    for (int64_t i = j < keys_vec ? rows_vec : 0; i < rows; ++i) {
      d[i] = mask_element<Kind>(head + (q0 + i) * row_bytes, at);
    }
    std::fill(d + rows, d + ld, 0.0f);
  }
  std::fill(mt + keys * ld, mt + keys_tile * ld, 0.0f);
}

// The block's mask in `buffer` (keys_tile · ld floats), as BlockMask describes it.
BlockMask block_mask(const AttentionArgs& a, int64_t b, int64_t h, int64_t q0, int64_t rows, int64_t k0, int64_t keys,
                     int64_t keys_tile, int64_t ld, float* buffer) {
  if (a.mask_kind == MaskKind::none) return {};
  const char* head =
      static_cast<const char*>(a.mask) + (b * a.mask_sb + h * a.mask_sh) * mask_element_bytes(a.mask_kind);
  if (a.mask_si == 0) {  // one mask row for every query
    for (int64_t j = 0; j < keys; ++j) buffer[j] = mask_value(a, head, k0 + j);
    std::fill(buffer + keys, buffer + keys_tile, 0.0f);
    return {buffer, 0};
  }
  const int64_t row_bytes = a.mask_si * mask_element_bytes(a.mask_kind);
  with_mask_kind(a.mask_kind, [&](auto kind) {
    transpose_mask_rows<decltype(kind)::value>(head, row_bytes, a.mask_sj, q0, rows, k0, keys, keys_tile, buffer, ld);
  });
  return {buffer, ld};
}

// tile[r][c] += the mask of key j0 + r and queries i0 + c·kW ...: the scores' tile as it leaves the registers.
void add_block_mask(typename V::Reg (&tile)[kTileRows][kTileVecs], const BlockMask& mask, int64_t j0, int64_t i0) {
  if (mask.add == nullptr) return;
  for (int64_t r = 0; r < kTileRows; ++r) {
    if (mask.ld == 0) {
      const auto add = V::set1(mask.add[j0 + r]);
      for (int64_t c = 0; c < kTileVecs; ++c) tile[r][c] = V::add(tile[r][c], add);
    } else {
      const float* row = mask.add + (j0 + r) * mask.ld + i0;
      for (int64_t c = 0; c < kTileVecs; ++c) tile[r][c] = V::add(tile[r][c], V::load(row + c * kW));
    }
  }
}

// The soft cap of a tile of scaled scores: softcap · tanh(score / softcap), before the mask is added.
template <typename Tile>
void soft_cap_tile(Tile& acc, float softcap) {
  const auto cap = V::set1(softcap), inverse = V::set1(1.0f / softcap);
  for (auto& row : acc) {
    for (auto& x : row) x = V::mul(cap, simd_math::tanh<V>(V::mul(x, inverse)));
  }
}

// st[j][i] = sum_e kp[j][e] · qt[e][i] + the block's mask, for j < rows_pad (a multiple of kTileRows), i < ld (of
// kTileCols); with `top`, also its maximum over the first `keys` rows (tile_maximum).
void scores(const float* kp, int64_t rows_pad, int64_t keys, int64_t dim, const float* qt, int64_t ld,
            const BlockMask& mask, float softcap, float* st, float* top) {
  for (int64_t j0 = 0; j0 < rows_pad; j0 += kTileRows) {
    for (int64_t i0 = 0; i0 < ld; i0 += kTileCols) {
      typename V::Reg acc[kTileRows][kTileVecs];
      for (auto& row : acc) {
        for (auto& a : row) a = V::set1(0.0f);
      }
      for (int64_t e = 0; e < dim; ++e) {
        typename V::Reg qv[kTileVecs];
        for (int64_t c = 0; c < kTileVecs; ++c) qv[c] = V::load(qt + e * ld + i0 + c * kW);
        for (int64_t r = 0; r < kTileRows; ++r) {
          const auto kb = V::set1(kp[(j0 + r) * dim + e]);
          for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = V::fmadd(kb, qv[c], acc[r][c]);
        }
      }
      if (softcap > 0.0f) soft_cap_tile(acc, softcap);
      add_block_mask(acc, mask, j0, i0);
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) V::store(st + (j0 + r) * ld + i0 + c * kW, acc[r][c]);
      }
      if (top != nullptr) tile_maximum(acc, keys - j0, top + i0);
    }
  }
}

// o[i][:] += sum_{j < keys} st[j][i] · vp[j][:] for i < rows_pad (a multiple of kTileRows), o and vp `ldv` wide
// (a multiple of kTileCols).
void accumulate_values(const float* st, int64_t ld, int64_t rows_pad, int64_t keys, const float* vp, int64_t ldv,
                       float* o) {
  for (int64_t i0 = 0; i0 < rows_pad; i0 += kTileRows) {
    for (int64_t c0 = 0; c0 < ldv; c0 += kTileCols) {
      typename V::Reg acc[kTileRows][kTileVecs];
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = V::load(o + (i0 + r) * ldv + c0 + c * kW);
      }
      for (int64_t j = 0; j < keys; ++j) {
        typename V::Reg vv[kTileVecs];
        for (int64_t c = 0; c < kTileVecs; ++c) vv[c] = V::load(vp + j * ldv + c0 + c * kW);
        for (int64_t r = 0; r < kTileRows; ++r) {
          const auto pb = V::set1(st[j * ld + i0 + r]);
          for (int64_t c = 0; c < kTileVecs; ++c) acc[r][c] = V::fmadd(pb, vv[c], acc[r][c]);
        }
      }
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < kTileVecs; ++c) V::store(o + (i0 + r) * ldv + c0 + c * kW, acc[r][c]);
      }
    }
  }
}

// The causal triangle over st[j][i]: key k0 + j (j < keys) is masked for the queries q0 + i before it.
void apply_causal(const AttentionArgs& a, int64_t q0, int64_t k0, int64_t keys, float* st, int64_t ld) {
  if (!a.causal) return;
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t masked = std::min(ld, std::max<int64_t>(0, k0 + j - q0));
    for (int64_t i = 0; i < masked; ++i) st[j * ld + i] = kNegInf;
  }
}

// The running softmax over one block of keys: per query i (vectors of them), m = max(m, max_j st[j][i]) (that
// maximum read from `tops` where the scores' pass found it, else found here),
// st[j][i] = e^(st[j][i] - m), l = l · e^(m_old - m) + sum_j st[j][i]; alpha[i] = e^(m_old - m) is the factor the
// output row must be rescaled by. A query whose scores are all -inf so far keeps m = -inf, gets probabilities 0
// (the exponent taken against 0 instead), and alpha 0 or 1 as its earlier state is empty anyway.
void softmax_block(float* st, int64_t ld, int64_t keys, float* m, float* l, float* alpha, const float* tops) {
  const auto lowest = V::set1(kLowest), zero = V::set1(0.0f);
  for (int64_t i = 0; i < ld; i += kW) {
    auto top = V::set1(kNegInf);
    if (tops != nullptr) {
      top = V::load(tops + i);  // (the scores' maximum, found as they were computed)
    } else {
      for (int64_t j = 0; j < keys; ++j) top = V::max(top, V::load(st + j * ld + i));
    }
    const auto m_old = V::load(m + i);
    const auto m_new = V::max(m_old, top);
    const auto pivot = V::select(V::lt(m_new, lowest), zero, m_new);
    // (Both exponents are of values <= 0: a score, or the old maximum, less the new maximum; NaN stays NaN.)
    const auto factor = simd_math::exp_nonpositive<V>(V::sub(m_old, pivot));
    auto sum = V::set1(0.0f);
    for (int64_t j = 0; j < keys; ++j) {
      const auto p = simd_math::exp_nonpositive<V>(V::sub(V::load(st + j * ld + i), pivot));
      V::store(st + j * ld + i, p);
      sum = V::add(sum, p);
    }
    V::store(m + i, m_new);
    V::store(l + i, V::fmadd(V::load(l + i), factor, sum));
    V::store(alpha + i, factor);
  }
}

// o[i][:] *= alpha[i] for i < ld: the output rows rescaled to the running maximum (softmax_block's alpha).
void rescale_outputs(const float* alpha, int64_t ld, float* o, int64_t ldv) {
  for (int64_t i = 0; i < ld; ++i) {
    if (alpha[i] == 1.0f) continue;
    const auto f = V::set1(alpha[i]);
    for (int64_t c = 0; c < ldv; c += kW) V::store(o + i * ldv + c, V::mul(V::load(o + i * ldv + c), f));
  }
}

// out[i][c] = o[i][c] / l[i] for i < rows, c < dim_v: a task's finished rows, `stride` elements apart.
template <typename T>
void store_outputs(const float* o, int64_t ldv, const float* l, int64_t rows, int64_t dim_v, T* out, int64_t stride) {
  for (int64_t i = 0; i < rows; ++i) {
    // l is 0 only where every score was masked (each unmasked key adds at least e^0 = 1 for the maximum).
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : (l[i] == 0.0f ? 0.0f : l[i]);
    const auto f = V::set1(inv);
    T* row = out + i * stride;
    int64_t c = 0;
    for (; c + kW <= dim_v; c += kW) V::store(row + c, V::mul(V::load(o + i * ldv + c), f));
    for (; c < dim_v; ++c) L::store(row + c, o[i * ldv + c] * inv);
  }
}

template <typename T>
void run_task(const AttentionArgs& a, int64_t task, simd::LocalVector<float>& scratch) {
  const int64_t blocks = (a.len_q + a.block_q - 1) / a.block_q;
  const int64_t block = task % blocks, bh = task / blocks;
  const int64_t h = bh % a.heads_q, b = bh / a.heads_q, g = h / (a.heads_q / a.heads_kv);
  const int64_t q0 = block * a.block_q, rows = std::min(a.block_q, a.len_q - q0);
  const int64_t ld = round_up(rows, std::max(kTileCols, kTileRows));
  const int64_t ldv = round_up(a.dim_v, kTileCols);
  const int64_t keys_pad = round_up(kBlockK, kTileRows);

  const size_t need =
      static_cast<size_t>(a.dim_qk * ld + keys_pad * a.dim_qk + 2 * keys_pad * ld + kBlockK * ldv + ld * ldv + 4 * ld);
  if (scratch.size() < need) scratch.resize(need);
  float* qt = scratch.data();
  float* kp = qt + a.dim_qk * ld;
  float* st = kp + keys_pad * a.dim_qk;
  float* mt = st + keys_pad * ld;
  float* vp = mt + keys_pad * ld;
  float* o = vp + kBlockK * ldv;
  float* m = o + ld * ldv;
  float* l = m + ld;
  float* alpha = l + ld;
  float* top = alpha + ld;

  const T* q = static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh + q0 * a.q.sl;
  const T* k = static_cast<const T*>(a.k.data) + b * a.k.sb + g * a.k.sh;
  const T* v = static_cast<const T*>(a.v.data) + b * a.v.sb + g * a.v.sh;
  pack_queries_transposed(q, a.q.sl, rows, a.dim_qk, a.scale, qt, ld);
  std::fill(o, o + ld * ldv, 0.0f);
  std::fill(m, m + ld, kNegInf);
  std::fill(l, l + ld, 0.0f);

  // Under the causal mask, keys after the block's last query are masked for all of its rows.
  const int64_t key_end = a.causal ? std::min(a.len_k, q0 + rows) : a.len_k;
  for (int64_t k0 = 0; k0 < key_end; k0 += kBlockK) {
    const int64_t keys = std::min(kBlockK, key_end - k0);
    const int64_t keys_tile = round_up(keys, kTileRows);
    pack_rows(k + k0 * a.k.sl, a.k.sl, keys, a.dim_qk, kp, a.dim_qk, keys_tile);
    const bool maximum = maximum_in_scores(a, q0, k0, keys);
    if (maximum) std::fill(top, top + ld, kNegInf);
    const BlockMask mask = block_mask(a, b, h, q0, rows, k0, keys, keys_tile, ld, mt);
    scores(kp, keys_tile, keys, a.dim_qk, qt, ld, mask, a.softcap, st, maximum ? top : nullptr);
    apply_causal(a, q0, k0, keys, st, ld);
    softmax_block(st, ld, keys, m, l, alpha, maximum ? top : nullptr);
    rescale_outputs(alpha, ld, o, ldv);
    pack_rows(v + k0 * a.v.sl, a.v.sl, keys, a.dim_v, vp, ldv, keys);
    accumulate_values(st, ld, round_up(rows, kTileRows), keys, vp, ldv, o);
  }

  store_outputs(o, ldv, l, rows, a.dim_v, static_cast<T*>(a.out.data) + b * a.out.sb + h * a.out.sh + q0 * a.out.sl,
                a.out.sl);
}

void attention_tasks(const AttentionArgs& a, int64_t task_begin, int64_t task_end) {
  simd::LocalVector<float> scratch;
  for (int64_t t = task_begin; t < task_end; ++t) {
    if (a.q.bf16) {
      run_task<uint16_t>(a, t, scratch);
    } else {
      run_task<float>(a, t, scratch);
    }
  }
}
