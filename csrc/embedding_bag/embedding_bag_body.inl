// The merged embedding bags' arithmetic, written once for a vector type V (simd/simd_*.inl): the float vectors of
// each ISA, or ScalarD for float64 tables. Included inside the anonymous namespace of embedding_bag_kernels.cpp
// (once per ISA), after the vector types (ScalarF always among them). Column tails and scalar sums go
// through Lane<V> and Real<V>, the one-element type of V's precision and its number type.
//
// A row is worked on in strips of up to 8 vectors (128 floats for AVX-512: a DLRM row in one strip), their sums
// held in registers while the strip's rows stream past; the columns a vector cannot fill go one at a time.

// How many positions ahead the pooling loop prefetches a row: enough rows in between to hide a DRAM miss on a
// table far larger than the caches, few enough that the lines are still there when their turn comes. Which of the
// row's lines it prefetches is a.prefetch (kernels::RowPrefetch), each one right after the same line's load; all
// lines ahead in a burst before the loads were no faster.
constexpr int64_t kPrefetchAhead = 16;

// A cache line, and how many of V's vectors of W fill one (at least one: a Lane's scalar is a vector to prefetch).
constexpr int kLineBytes = 64;
template <typename V, typename W>
constexpr int kVectorsPerLine = std::max<int>(1, kLineBytes / (V::kWidth * static_cast<int>(sizeof(W))));

// --- pooling ----------------------------------------------------------------------------------------------------

// Adds row `row` (NV vectors from column c), scaled when kWeighted, into acc. With kPrefetch, prefetches the lines
// of row `ahead` that kWhich names as it goes: the strip's every line, or (first_line) the strip's first vector's,
// which the caller asks for only for the strip that starts the row.
template <typename V, int NV, bool kWeighted, bool kPrefetch, kernels::RowPrefetch kWhich, typename W>
inline void accumulate_row(const W* row, const W* ahead, Real<V> weight, typename V::Reg* acc) {
  constexpr bool kEvery = kWhich == kernels::RowPrefetch::every_line;
  const auto s = V::set1(weight);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const auto x = V::load(row + v * V::kWidth);
    acc[v] = kWeighted ? V::fmadd(s, x, acc[v]) : V::add(acc[v], x);
    if (kPrefetch && (kEvery ? v % kVectorsPerLine<V, W> == 0 : v == 0)) __builtin_prefetch(ahead + v * V::kWidth);
  }
}

template <typename V, int NV, bool kWeighted, kernels::RowPrefetch kWhich, typename W, typename Idx>
inline void pool_strip(const kernels::BagArgs<W, Idx>& a, int64_t b, int64_t c, bool prefetch) {
  const int64_t begin = a.bag_begin(b), end = a.bag_end(b);
  const W* weight = a.weight + c;
  const Idx* indices = a.indices;
  const Arithmetic<W>* psw = a.per_sample_weights;
  const int64_t dim = a.dim;
  typename V::Reg acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = V::set1(0.0f);
  // Positions whose row kPrefetchAhead further on is still one of the call's: prefetch that row first.
  const int64_t prefetch_end = prefetch ? std::min(end, a.last_end - kPrefetchAhead) : begin;
  int64_t p = begin;
  for (; p < prefetch_end; ++p) {
    accumulate_row<V, NV, kWeighted, true, kWhich>(weight + static_cast<int64_t>(indices[p]) * dim,
                                                   weight + static_cast<int64_t>(indices[p + kPrefetchAhead]) * dim,
                                                   kWeighted ? psw[p] : Real<V>{1}, acc);
  }
  for (; p < end; ++p) {
    accumulate_row<V, NV, kWeighted, false, kWhich>(weight + static_cast<int64_t>(indices[p]) * dim, weight,
                                                    kWeighted ? psw[p] : Real<V>{1}, acc);
  }
  if (a.mean && end > begin) {
    const auto length = V::set1(static_cast<Real<V>>(end - begin));
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = V::div(acc[v], length);
  }
  W* out = a.out + b * dim + c;
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) V::store(out + v * V::kWidth, acc[v]);
}

template <typename V, bool kWeighted, kernels::RowPrefetch kWhich, typename W, typename Idx>
void pool_bags(const kernels::BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  constexpr bool kEvery = kWhich == kernels::RowPrefetch::every_line;
  for (int64_t b = bag_begin; b < bag_end; ++b) {
    const int64_t tail = for_each_strip<V>(a.dim, [&](auto nv, int64_t c) {
      pool_strip<V, decltype(nv)::value, kWeighted, kWhich>(a, b, c, kEvery || c == 0);
    });
    for (int64_t c = tail; c < a.dim; ++c) pool_strip<Lane<V>, 1, kWeighted, kWhich>(a, b, c, false);
  }
}

template <typename V, typename W, typename Idx>
void pool_range(const kernels::BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  using kernels::RowPrefetch;
  auto run = [&](auto weighted) {
    if (a.prefetch == RowPrefetch::first_line) {
      pool_bags<V, decltype(weighted)::value, RowPrefetch::first_line>(a, bag_begin, bag_end);
    } else {
      pool_bags<V, decltype(weighted)::value, RowPrefetch::every_line>(a, bag_begin, bag_end);
    }
  };
  if (a.per_sample_weights != nullptr) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

// --- per-sample-weight gradient -----------------------------------------------------------------------------------

template <typename V, typename W, typename Idx>
void per_sample_grad_range(const kernels::BagArgs<W, Idx>& a, int64_t bag_begin, int64_t bag_end) {
  for (int64_t b = bag_begin; b < bag_end; ++b) {
    const W* grad = a.grad_out + b * a.dim;
    for (int64_t p = a.bag_begin(b), end = a.bag_end(b); p < end; ++p) {
      const W* row = a.weight + static_cast<int64_t>(a.indices[p]) * a.dim;
      auto acc = V::set1(0.0f);
      int64_t c = 0;
      for (; c + V::kWidth <= a.dim; c += V::kWidth) acc = V::fmadd(V::load(row + c), V::load(grad + c), acc);
      Real<V> sum = V::hsum(acc);
      for (; c < a.dim; ++c) sum = Lane<V>::fmadd(Lane<V>::load(row + c), Lane<V>::load(grad + c), sum);
      a.grad_per_sample[p] = sum;
    }
  }
}

// --- row segments: gradients and fused updates ----------------------------------------------------------------------

// A weight vector at w (W = uint16_t: bfloat16, or with `bottom` the high halves of split-BF16 float32).
template <typename V, typename W>
inline typename V::Reg load_weight(const W* w, const uint16_t* bottom) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (bottom != nullptr) return V::join(w, bottom);
  }
  return V::load(w);
}

template <typename V, typename W>
inline void store_weight(W* w, uint16_t* bottom, typename V::Reg x) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (bottom != nullptr) return V::split(w, bottom, x);
  }
  V::store(w, x);
}

// How many positions ahead a row segment's gradient loop prefetches the gradient row it will add.
constexpr int64_t kGradPrefetchAhead = 16;

template <typename V, int NV, typename W>
inline void row_strip(const kernels::RowArgs<W>& a, int64_t s, int64_t c) {
  typename V::Reg g[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) g[v] = V::set1(0.0f);
  auto add_position = [&](int64_t k) {
    const int64_t p = a.sorted_pos[k];
    const int64_t b = a.bag_of[p];
    const Real<V> scale = a.per_sample_weights != nullptr ? a.per_sample_weights[p]
                          : a.inv_len != nullptr          ? a.inv_len[b]
                                                          : Real<V>{1};
    const auto sv = V::set1(scale);
    const W* grad = a.grad_out + b * a.dim + c;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) g[v] = V::fmadd(sv, V::load(grad + v * V::kWidth), g[v]);
  };
  // In row order the positions' gradient rows are scattered over grad_out: prefetch the strip of the one
  // kGradPrefetchAhead positions on (across segments, within the table), as the pooling loop does with rows.
  const int64_t begin = a.seg_start[s], end = a.seg_start[s + 1];
  const int64_t prefetch_end = V::kWidth > 1 ? std::min(end, a.positions - kGradPrefetchAhead) : begin;
  int64_t k = begin;
  for (; k < prefetch_end; ++k) {
    const W* ahead = a.grad_out + a.bag_of[a.sorted_pos[k + kGradPrefetchAhead]] * a.dim + c;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v += kVectorsPerLine<V, W>) __builtin_prefetch(ahead + v * V::kWidth);
    add_position(k);
  }
  for (; k < end; ++k) add_position(k);
  if (a.op == kernels::RowOp::gradient) {
    Arithmetic<W>* out = a.values + s * a.dim + c;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::store(out + v * V::kWidth, g[v]);
    return;
  }
  // The update works from locals, not a's fields: its stores go through float pointers, which as far as the
  // compiler knows may alias a's float fields, so it reloaded the pointers and hyper-parameters (and tested
  // weight_decay again) after every store, which held each load back behind the store before it.
  const int64_t at = a.seg_row[s] * a.dim + c;
  W* const weight = a.weight + at;
  uint16_t* const bottom = a.bottom != nullptr ? a.bottom + at : nullptr;
  const bool adagrad = a.op == kernels::RowOp::adagrad, decay = a.weight_decay != 0.0f;
  Arithmetic<W>* const state_sum = adagrad ? a.state_sum + at : nullptr;
  const auto neg_lr = V::set1(a.neg_lr), weight_decay = V::set1(a.weight_decay), eps = V::set1(a.eps);
  typename V::Reg w[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) w[v] = load_weight<V>(weight + v * V::kWidth, bottom ? bottom + v * V::kWidth : nullptr);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    auto grad = decay ? V::fmadd(weight_decay, w[v], g[v]) : g[v];
    if (adagrad) {
      const auto sum = V::fmadd(grad, grad, V::load(state_sum + v * V::kWidth));
      V::store(state_sum + v * V::kWidth, sum);
      grad = V::div(grad, V::add(V::sqrt(sum), eps));
    }
    store_weight<V>(weight + v * V::kWidth, bottom ? bottom + v * V::kWidth : nullptr, V::fmadd(neg_lr, grad, w[v]));
  }
}

// How many segments ahead a fused update prefetches the row it will read and write. A large table's rows come from
// memory, one miss a segment (two with Adagrad's state, and split-BF16's low halves another), and the loop does too
// little else between them for out-of-order execution to hide them.
constexpr int64_t kUpdatePrefetchAhead = 8;

// Forced inline: GCC 12 judged a function that does nothing but prefetch to have no side effects and deleted every
// call to it (not one prefetch was left); inlined, the prefetches stay.
template <typename T>
[[gnu::always_inline]] inline void prefetch_lines(const T* first, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(first);
  const int64_t size = count * static_cast<int64_t>(sizeof(T));
  if (size == 0) return;
  for (int64_t at = 0; at < size; at += kLineBytes) __builtin_prefetch(bytes + at);
  __builtin_prefetch(bytes + size - 1);  // the last line, when the row does not start on one
}

template <typename W>
[[gnu::always_inline]] inline void prefetch_update(const kernels::RowArgs<W>& a, int64_t s) {
  const int64_t at = a.seg_row[s] * a.dim;
  prefetch_lines(a.weight + at, a.dim);
  if (a.bottom != nullptr) prefetch_lines(a.bottom + at, a.dim);
  if (a.op == kernels::RowOp::adagrad) prefetch_lines(a.state_sum + at, a.dim);
}

template <typename V, typename W>
void rows_range(const kernels::RowArgs<W>& a, int64_t segment_begin, int64_t segment_end) {
  const bool update = a.op != kernels::RowOp::gradient;
  for (int64_t s = segment_begin; s < segment_end; ++s) {
    if (update && s + kUpdatePrefetchAhead < segment_end) prefetch_update(a, s + kUpdatePrefetchAhead);
    const int64_t tail =
        for_each_strip<V>(a.dim, [&](auto nv, int64_t c) { row_strip<V, decltype(nv)::value>(a, s, c); });
    for (int64_t c = tail; c < a.dim; ++c) row_strip<Lane<V>, 1>(a, s, c);
  }
}
