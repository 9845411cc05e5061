// The merged embedding bags' arithmetic, written once for a vector type V (simd/simd_*.inl): the float vectors of
// each ISA, or ScalarD for float64 tables. Included inside an anonymous namespace of each embedding_bag_<isa>.cpp
// (and embedding_bag_f64.cpp), after the vector types (ScalarF always among them). Column tails and scalar sums go
// through Lane<V> and Real<V>, the one-element type of V's precision and its number type.
//
// A row is worked on in strips of up to 8 vectors (128 floats for AVX-512: a DLRM row in one strip), their sums
// held in registers while the strip's rows stream past; the columns a vector cannot fill go one at a time.

// How many positions ahead the pooling loop prefetches a row: enough rows in between to hide a DRAM miss on a
// table far larger than the caches, few enough that the lines are still there when their turn comes. Which of the
// row's lines it prefetches is a.prefetch (kernels::RowPrefetch), each one right after the same line's load; all
// lines ahead in a burst before the loads were no faster.
constexpr int64_t kPrefetchAhead = 16;

// --- pooling ----------------------------------------------------------------------------------------------------

// Adds row `row` (NV vectors from column c), scaled when kWeighted, into acc. With kPrefetch, prefetches the lines
// of row `ahead` that kWhich names as it goes: the strip's every line, or (first_line) the strip's first vector's,
// which the caller asks for only for the strip that starts the row.
template <typename V, int NV, bool kWeighted, bool kPrefetch, kernels::RowPrefetch kWhich, typename W>
inline void accumulate_row(const W* row, const W* ahead, Real<V> weight, typename V::Reg* acc) {
  constexpr int kVectorsPerLine = std::max<int>(1, 64 / (V::kWidth * static_cast<int>(sizeof(W))));
  constexpr bool kEvery = kWhich == kernels::RowPrefetch::every_line;
  const auto s = V::set1(weight);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const auto x = V::load(row + v * V::kWidth);
    acc[v] = kWeighted ? V::fmadd(s, x, acc[v]) : V::add(acc[v], x);
    if (kPrefetch && (kEvery ? v % kVectorsPerLine == 0 : v == 0)) __builtin_prefetch(ahead + v * V::kWidth);
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

template <typename V, typename W>
inline typename V::Reg load_weight(const kernels::RowArgs<W>& a, int64_t i) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (a.bottom != nullptr) return V::join(a.weight + i, a.bottom + i);
  }
  return V::load(a.weight + i);
}

template <typename V, typename W>
inline void store_weight(const kernels::RowArgs<W>& a, int64_t i, typename V::Reg w) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (a.bottom != nullptr) return V::split(a.weight + i, a.bottom + i, w);
  }
  V::store(a.weight + i, w);
}

template <typename V, int NV, typename W>
inline void row_strip(const kernels::RowArgs<W>& a, int64_t s, int64_t c) {
  typename V::Reg g[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) g[v] = V::set1(0.0f);
  for (int64_t k = a.seg_start[s], end = a.seg_start[s + 1]; k < end; ++k) {
    const int64_t p = a.sorted_pos[k];
    const int64_t b = a.bag_of[p];
    const Real<V> scale = a.per_sample_weights != nullptr ? a.per_sample_weights[p]
                          : a.inv_len != nullptr          ? a.inv_len[b]
                                                          : Real<V>{1};
    const auto sv = V::set1(scale);
    const W* grad = a.grad_out + b * a.dim + c;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) g[v] = V::fmadd(sv, V::load(grad + v * V::kWidth), g[v]);
  }
  if (a.op == kernels::RowOp::gradient) {
    Arithmetic<W>* out = a.values + s * a.dim + c;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::store(out + v * V::kWidth, g[v]);
    return;
  }
  const int64_t at = a.seg_row[s] * a.dim + c;
  const auto neg_lr = V::set1(a.neg_lr), weight_decay = V::set1(a.weight_decay);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int64_t i = at + v * V::kWidth;
    auto w = load_weight<V>(a, i);
    auto grad = a.weight_decay != 0.0f ? V::fmadd(weight_decay, w, g[v]) : g[v];
    if (a.op == kernels::RowOp::adagrad) {
      const auto sum = V::fmadd(grad, grad, V::load(a.state_sum + i));
      V::store(a.state_sum + i, sum);
      grad = V::div(grad, V::add(V::sqrt(sum), V::set1(a.eps)));
    }
    store_weight<V>(a, i, V::fmadd(neg_lr, grad, w));
  }
}

template <typename V, typename W>
void rows_range(const kernels::RowArgs<W>& a, int64_t segment_begin, int64_t segment_end) {
  for (int64_t s = segment_begin; s < segment_end; ++s) {
    const int64_t tail =
        for_each_strip<V>(a.dim, [&](auto nv, int64_t c) { row_strip<V, decltype(nv)::value>(a, s, c); });
    for (int64_t c = tail; c < a.dim; ++c) row_strip<Lane<V>, 1>(a, s, c);
  }
}
