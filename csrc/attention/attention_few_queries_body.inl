// Scaled dot-product attention for a few queries a head (ember/attention.h; at most kFewQueries: a token being
// decoded, or Whisper's four-token prompt against its encoder's 1500 frames), written once for the file's float
// vector type V (`using V = ...` before inclusion, after the vector types, simd_math.inl and attention_mask.inl).
//
// The general path lays a block of queries along the vector lanes (or the tile rows) and shares a head's keys among
// them; with one to four queries those lanes stay mostly empty, and a sequence's few heads leave most threads idle
// (Whisper's cross-attention: 6 tasks for 16 cores, 96 us on the Xeon where torch's kernel takes 79). Here a task is
// one (batch, key/value head, chunk of kFewQueryChunk keys) with every query row of the head group (grouped-query
// heads share their keys): each score a dot product along the features (vectors, then one sum across the lanes),
// the softmax along the chunk's keys, each row's output accumulated from whole value rows. A task leaves its chunk's
// partial result (the outputs not yet divided, their row's maximum and sum); few_query_combine merges a row's chunks
// in chunk order. The chunks are fixed by the key count alone, so the result does not depend on the thread count.
// Arithmetic is float32 throughout (bf16 scores on vdpbf16ps where the compilation has it: float32 sums of exact
// products); the probabilities multiply the values unrounded, as attention_body.inl's do.
using L = Lane<V>;

constexpr int64_t kW = V::kWidth;
constexpr int64_t kFewRowTile = 4;                   // query rows a pass over the keys takes at once
constexpr int64_t kFewValueVecs = kW >= 16 ? 4 : 2;  // output vectors a row keeps in registers per pass
constexpr int64_t kChunkPad = kFewQueryChunk;        // a row's scores in scratch (a multiple of every width)

constexpr int64_t round_to_width(int64_t n) { return (n + kW - 1) / kW * kW; }

// The vector of src[from .. from + kW) widened to float, zero past `count` elements (the row's end): a row's last,
// partial vector, read without touching anything past the row, through `lanes` (kW floats of the task's scratch:
// this code stores no vector to an array on the stack, which GCC 13's sanitized AVX-512 build got wrong).
template <typename T>
typename V::Reg load_partial(const T* src, int64_t from, int64_t count, float* lanes) {
  if (from + kW <= count) return V::load(src + from);
  for (int64_t e = 0; e < kW; ++e) lanes[e] = from + e < count ? L::load(src + from + e) : 0.0f;
  return V::load(lanes);
}

// s[r][j] = sum_e qs[r][e] · k_j[e] for rows r < NR of the tile and keys j < keys, k_j at k + j·stride.
template <int NR, typename T>
void few_scores(const float* qs, int64_t ldq, const T* k, int64_t stride, int64_t keys, int64_t dim, float* s,
                float* lanes) {
  for (int64_t j = 0; j < keys; ++j) {
    const T* key = k + j * stride;
    typename V::Reg acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = V::set1(0.0f);
    for (int64_t e = 0; e < dim; e += kW) {
      const auto kv = load_partial(key, e, dim, lanes);
      for (int r = 0; r < NR; ++r) acc[r] = V::fmadd(kv, V::load(qs + r * ldq + e), acc[r]);
    }
    for (int r = 0; r < NR; ++r) s[r * kChunkPad + j] = V::hsum(acc[r]);
  }
}

// o[r][c0 .. c0 + NC·kW) = sum_j p[r][j] · v_j[...] for rows r < NR of the tile (added to o's values when
// `accumulate`: a chunk's later segments of keys).
template <int NR, int NC, typename T>
void few_values(const float* p, const T* v, int64_t stride, int64_t keys, int64_t dim_v, int64_t c0, float* o,
                int64_t ldv, float* lanes, bool accumulate) {
  typename V::Reg acc[NR][NC];
  for (int r = 0; r < NR; ++r) {
    for (int c = 0; c < NC; ++c) acc[r][c] = accumulate ? V::load(o + r * ldv + c0 + c * kW) : V::set1(0.0f);
  }
  for (int64_t j = 0; j < keys; ++j) {
    typename V::Reg vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load_partial(v + j * stride, c0 + c * kW, dim_v, lanes);
    for (int r = 0; r < NR; ++r) {
      const auto pb = V::set1(p[r * kChunkPad + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = V::fmadd(pb, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int c = 0; c < NC; ++c) V::store(o + r * ldv + c0 + c * kW, acc[r][c]);
  }
}

#if EMBER_KERNEL_LEVEL == 3
// bf16 scores on vdpbf16ps (the AVX512-BF16 compilation): a query's and a key's feature pairs multiplied into float32
// lanes as they lie, 32 features an instruction where the widened path takes 16 and a widening of the key; the scale
// multiplies the sum. The last, partial step reads both rows through a zeroing mask, nothing past either row.
template <int NR>
void few_scores_pairs(const uint16_t* const* q, const uint16_t* k, int64_t stride, int64_t keys, int64_t dim,
                      float scale, float* s) {
  for (int64_t j = 0; j < keys; ++j) {
    const uint16_t* key = k + j * stride;
    __m512 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t e = 0; e < dim; e += 32) {
      const auto mask = dim - e >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << (dim - e)) - 1);
      const auto kv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, key + e));
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm512_dpbf16_ps(acc[r], reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, q[r] + e)), kv);
      }
    }
    for (int r = 0; r < NR; ++r) s[r * kChunkPad + j] = V::hsum(acc[r]) * scale;
  }
}

#endif

// fn(std::integral_constant<int, NR>{}) for a row tile of nr = NR rows (1 to kFewRowTile): the tile's size as a
// constant of the kernels it picks.
template <typename Fn>
void with_tile_rows(int64_t nr, Fn&& fn) {
  switch (nr) {
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    default: fn(std::integral_constant<int, 1>{}); break;
  }
}
static_assert(kFewRowTile == 4, "with_tile_rows names each tile size");

// The mask's values for one query's row over keys [k0, k0 + keys), added to s; the kind decided once a row.
template <MaskKind Kind>
void add_mask_row(const char* row, int64_t key_stride, int64_t k0, int64_t keys, float* s) {
  for (int64_t j = 0; j < keys; ++j) s[j] += mask_element<Kind>(row, (k0 + j) * key_stride);
}

// Row r's softmax over its chunk's scores (keys past `keys` already -inf): p = e^(s - m) in place, m and l out. A
// row whose every score is masked keeps m = -inf and takes its exponents against 0 (probabilities 0, l = 0).
void few_softmax_row(float* s, float& m, float& l, float* lanes) {
  auto top = V::set1(kNegInf);
  for (int64_t j = 0; j < kChunkPad; j += kW) top = V::max(top, V::load(s + j));  // NaN-propagating
  V::store(lanes, top);
  float row_max = lanes[0];
  for (int64_t e = 1; e < kW; ++e) row_max = ScalarF::max(row_max, lanes[e]);
  const auto pivot = V::set1(row_max < kLowest ? 0.0f : row_max);
  auto sum = V::set1(0.0f);
  for (int64_t j = 0; j < kChunkPad; j += kW) {
    const auto p = simd_math::exp_nonpositive<V>(V::sub(V::load(s + j), pivot));
    V::store(s + j, p);
    sum = V::add(sum, p);
  }
  m = row_max;
  l = V::hsum(sum);
}

// The chunk's keys and values as runs that each lie at one stride: fn(k, k_stride, v, v_stride, j0, count) for the
// chunk's keys j0 .. j0 + count. One run of the k and v operands; with a cache, one a block.
template <typename T, typename Fn>
void for_key_runs(const AttentionArgs& a, int64_t b, int64_t g, int64_t k0, int64_t keys, Fn&& fn) {
  if (a.cache == nullptr) {
    fn(static_cast<const T*>(a.k.data) + b * a.k.sb + g * a.k.sh + k0 * a.k.sl, a.k.sl,
       static_cast<const T*>(a.v.data) + b * a.v.sb + g * a.v.sh + k0 * a.v.sl, a.v.sl, int64_t{0}, keys);
    return;
  }
  const CacheBlocks& c = *a.cache;
  for (int64_t j = 0; j < keys;) {
    const int64_t position = k0 + j, row = position % c.block_tokens;
    const int64_t count = std::min(keys - j, c.block_tokens - row);
    const char* block = c.table[b * c.stride + position / c.block_tokens];
    const T* k = reinterpret_cast<const T*>(block + c.key_offset + g * c.key_head_bytes) + row * a.dim_qk;
    const T* v = reinterpret_cast<const T*>(block + c.value_offset + g * c.value_head_bytes) + row * a.dim_v;
    fn(k, a.dim_qk, v, a.dim_v, j, count);
    j += count;
  }
}

// The chunk's scores s[r][j] of the group's rows (query_row(r): where row r's query lies) against its keys.
template <typename T, typename QueryRow>
void chunk_scores(const AttentionArgs& a, const QueryRow& query_row, int64_t rows, int64_t b, int64_t g, int64_t k0,
                  int64_t keys, float* qs, float* s, float* lanes) {
#if EMBER_KERNEL_LEVEL == 3
  if constexpr (std::is_same_v<T, uint16_t>) {
    for (int64_t r0 = 0; r0 < rows; r0 += kFewRowTile) {
      const int64_t nr = std::min(kFewRowTile, rows - r0);
      const uint16_t* q[kFewRowTile] = {};
      for (int64_t r = 0; r < nr; ++r) q[r] = query_row(r0 + r);
      with_tile_rows(nr, [&](auto tile) {
        for_key_runs<T>(a, b, g, k0, keys, [&](const T* k, int64_t stride, const T*, int64_t, int64_t j0, int64_t n) {
          few_scores_pairs<decltype(tile)::value>(q, k, stride, n, a.dim_qk, a.scale, s + r0 * kChunkPad + j0);
        });
      });
    }
    return;
  }
#endif
  // The query rows widened, scaled (as attention_body.inl scales its queries) and zero-padded to whole vectors.
  const int64_t ldq = round_to_width(a.dim_qk);
  for (int64_t r = 0; r < rows; ++r) {
    const T* q = query_row(r);
    for (int64_t e = 0; e < ldq; ++e) qs[r * ldq + e] = e < a.dim_qk ? L::load(q + e) * a.scale : 0.0f;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kFewRowTile) {
    with_tile_rows(std::min(kFewRowTile, rows - r0), [&](auto tile) {
      for_key_runs<T>(a, b, g, k0, keys, [&](const T* k, int64_t stride, const T*, int64_t, int64_t j0, int64_t n) {
        few_scores<decltype(tile)::value>(qs + r0 * ldq, ldq, k, stride, n, a.dim_qk, s + r0 * kChunkPad + j0, lanes);
      });
    });
  }
}

// The keys query (b, i) sees, [begin, end): from the key limits (and the window), the causal bound, or all `keys`.
inline void visible_keys(const AttentionArgs& a, int64_t b, int64_t i, int64_t keys, int64_t& begin, int64_t& end) {
  end = a.key_limits != nullptr ? a.key_limits[b * a.len_q + i] : (a.causal ? i + 1 : keys);
  begin = a.window > 0 ? end - a.window : 0;
}

template <typename T>
void few_query_task(const AttentionArgs& a, const FewQueryPartials& part, int64_t task,
                    simd::LocalVector<float>& scratch) {
  const int64_t bg = task / part.chunks, chunk = task % part.chunks;
  const int64_t b = bg / a.heads_kv, g = bg % a.heads_kv, group = a.heads_q / a.heads_kv;
  const int64_t key_count = a.cache != nullptr ? a.cache->lengths[b] : part.key_end;  // this sequence's keys
  const int64_t k0 = chunk * kFewQueryChunk, keys = std::clamp<int64_t>(key_count - k0, 0, kFewQueryChunk);
  const int64_t rows = part.rows, ldq = round_to_width(a.dim_qk);
  float* m = part.m + (bg * part.chunks + chunk) * rows;
  float* l = part.l + (bg * part.chunks + chunk) * rows;
  float* o = part.o + (bg * part.chunks + chunk) * rows * part.ldv;
  if (keys == 0) {  // a chunk past this sequence's keys (a shorter sequence of a cache): an empty partial result
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.0f);
    std::fill(o, o + rows * part.ldv, 0.0f);
    return;
  }
  const size_t need = static_cast<size_t>(rows * ldq + rows * kChunkPad + kW);
  if (scratch.size() < need) scratch.resize(need);
  float* qs = scratch.data();
  float* s = qs + rows * ldq;
  float* lanes = s + rows * kChunkPad;

  const auto query_row = [&](int64_t r) {
    const int64_t h = g * group + r / a.len_q, i = r % a.len_q;
    return static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh + i * a.q.sl;
  };
  chunk_scores<T>(a, query_row, rows, b, g, k0, keys, qs, s, lanes);

  const int64_t element = a.mask_kind == MaskKind::none ? 0 : mask_element_bytes(a.mask_kind);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = g * group + r / a.len_q, i = r % a.len_q;
    float* row = s + r * kChunkPad;
    if (a.softcap > 0.0f) {  // the scaled scores capped before the mask (whole vectors: past `keys` is masked below)
      const auto cap = V::set1(a.softcap), inverse = V::set1(1.0f / a.softcap);
      for (int64_t j = 0; j < round_to_width(keys); j += kW) {
        V::store(row + j, V::mul(cap, simd_math::tanh<V>(V::mul(V::load(row + j), inverse))));
      }
    }
    with_mask_kind(a.mask_kind, [&](auto kind) {
      const char* mask_row =
          static_cast<const char*>(a.mask) + (b * a.mask_sb + h * a.mask_sh + i * a.mask_si) * element;
      add_mask_row<decltype(kind)::value>(mask_row, a.mask_sj, k0, keys, row);
    });
    // Keys outside the row's visible range, and past the chunk's keys (padding), are masked.
    int64_t begin = 0, end = 0;
    visible_keys(a, b, i, key_count, begin, end);
    const int64_t first = std::clamp<int64_t>(begin - k0, 0, keys), last = std::clamp<int64_t>(end - k0, 0, keys);
    std::fill(row, row + first, kNegInf);
    std::fill(row + std::max(first, last), row + kChunkPad, kNegInf);
    few_softmax_row(row, m[r], l[r], lanes);
  }

  for (int64_t r0 = 0; r0 < rows; r0 += kFewRowTile) {
    with_tile_rows(std::min(kFewRowTile, rows - r0), [&](auto tile) {
      constexpr int kRows = decltype(tile)::value;
      const float* p = s + r0 * kChunkPad;
      float* o_rows = o + r0 * part.ldv;
      for_key_runs<T>(a, b, g, k0, keys, [&](const T*, int64_t, const T* v, int64_t stride, int64_t j0, int64_t n) {
        const bool more = j0 > 0;
        int64_t c0 = 0;
        for (; c0 + kFewValueVecs * kW <= part.ldv; c0 += kFewValueVecs * kW) {
          few_values<kRows, kFewValueVecs>(p + j0, v, stride, n, a.dim_v, c0, o_rows, part.ldv, lanes, more);
        }
        for (; c0 < part.ldv; c0 += kW) {
          few_values<kRows, 1>(p + j0, v, stride, n, a.dim_v, c0, o_rows, part.ldv, lanes, more);
        }
      });
    });
  }
}

// Output rows [row_begin, row_end) of the (batch, query head, query) list: each row's chunks merged in chunk order,
// every chunk's outputs and sum rescaled from its own maximum to the row's, then divided by the row's sum (0 where
// every key was masked, as the general path gives).
template <typename T>
void few_query_combine_rows(const AttentionArgs& a, const FewQueryPartials& part, int64_t row_begin, int64_t row_end,
                            simd::LocalVector<float>& scratch) {
  if (scratch.size() < static_cast<size_t>(part.ldv)) scratch.resize(static_cast<size_t>(part.ldv));
  float* acc = scratch.data();
  const int64_t group = a.heads_q / a.heads_kv;
  for (int64_t t = row_begin; t < row_end; ++t) {
    const int64_t i = t % a.len_q, h = (t / a.len_q) % a.heads_q, b = t / (a.len_q * a.heads_q);
    const int64_t g = h / group, r = (h - g * group) * a.len_q + i, bg = b * a.heads_kv + g;
    const int64_t first = bg * part.chunks * part.rows + r;  // chunk c's entry: first + c·rows
    float row_max = kNegInf;
    for (int64_t c = 0; c < part.chunks; ++c) row_max = ScalarF::max(row_max, part.m[first + c * part.rows]);
    const float pivot = row_max < kLowest ? 0.0f : row_max;
    float sum = 0.0f;
    std::fill(acc, acc + part.ldv, 0.0f);
    for (int64_t c = 0; c < part.chunks; ++c) {
      const int64_t at = first + c * part.rows;
      // (A value <= 0, or NaN: the chunk's maximum less the row's.)
      const float factor = simd_math::exp_nonpositive<ScalarF>(part.m[at] - pivot);
      sum = std::fma(part.l[at], factor, sum);
      const auto f = V::set1(factor);
      const float* o = part.o + at * part.ldv;
      for (int64_t e = 0; e < part.ldv; e += kW) V::store(acc + e, V::fmadd(V::load(o + e), f, V::load(acc + e)));
    }
    const float inv = sum > 0.0f ? 1.0f / sum : (sum == 0.0f ? 0.0f : sum);
    const auto f = V::set1(inv);
    T* out = static_cast<T*>(a.out.data) + b * a.out.sb + h * a.out.sh + i * a.out.sl;
    int64_t e = 0;
    for (; e + kW <= a.dim_v; e += kW) V::store(out + e, V::mul(V::load(acc + e), f));
    for (; e < a.dim_v; ++e) L::store(out + e, acc[e] * inv);
  }
}

void few_query_tasks(const AttentionArgs& a, const FewQueryPartials& part, int64_t task_begin, int64_t task_end) {
  simd::LocalVector<float> scratch;
  for (int64_t t = task_begin; t < task_end; ++t) {
    if (a.q.bf16) {
      few_query_task<uint16_t>(a, part, t, scratch);
    } else {
      few_query_task<float>(a, part, t, scratch);
    }
  }
}

void few_query_combine(const AttentionArgs& a, const FewQueryPartials& part, int64_t row_begin, int64_t row_end) {
  simd::LocalVector<float> scratch;
  if (a.q.bf16) {
    few_query_combine_rows<uint16_t>(a, part, row_begin, row_end, scratch);
  } else {
    few_query_combine_rows<float>(a, part, row_begin, row_end, scratch);
  }
}
