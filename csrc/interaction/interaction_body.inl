// The dot interaction's arithmetic, written once for a vector type V (simd/simd_*.inl): each ISA's float vector,
// or ScalarD for float64. Included inside a namespace of interaction_kernels.cpp (once per ISA, and for double),
// after the vector types, simd_strips.inl and `using V = <the file's vector type>`. R is V's number type (float, or
// double), Lane the one-element type of its precision.
//
// A sample's vectors are at most a few dozen rows of a few hundred floats: they stay in L1 while every pair is
// formed. bfloat16 rows are widened once per sample into a float32 scratch block, so each pair reads floats.
using R = Real<V>;
using L = Lane<V>;

// The sample's rows in R: pointers into the inputs when they hold R already, into `scratch` (widened) for bfloat16.
template <typename W>
inline void sample_rows(const kernels::Args<W>& a, int64_t b, simd::LocalVector<R>& scratch, const R** rows) {
  if constexpr (std::is_same_v<W, R>) {
    for (int i = 0; i < a.n; ++i) rows[i] = a.inputs[i] + b * a.dim;
  } else {
    scratch.resize(static_cast<size_t>(a.n * a.dim));
    for (int i = 0; i < a.n; ++i) {
      R* row = scratch.data() + i * a.dim;
      const W* src = a.inputs[i] + b * a.dim;
      int64_t c = 0;
      for (; c + V::kWidth <= a.dim; c += V::kWidth) V::store(row + c, V::load(src + c));
      for (; c < a.dim; ++c) row[c] = L::load(src + c);
      rows[i] = row;
    }
  }
}

// The dots of row x with rows y[0..K), in R, vector lanes first and then the tail.
template <int K>
inline void dots(const R* x, const R* const* y, int64_t dim, R* out) {
  typename V::Reg acc[K];
  for (int k = 0; k < K; ++k) acc[k] = V::set1(0.0f);
  int64_t c = 0;
  for (; c + V::kWidth <= dim; c += V::kWidth) {
    const auto xc = V::load(x + c);
    for (int k = 0; k < K; ++k) acc[k] = V::fmadd(xc, V::load(y[k] + c), acc[k]);
  }
  for (int k = 0; k < K; ++k) {
    R sum = V::hsum(acc[k]);
    for (int64_t t = c; t < dim; ++t) sum = L::fmadd(x[t], y[k][t], sum);
    out[k] = sum;
  }
}

template <typename W>
void forward_range(const kernels::Args<W>& a, int64_t begin, int64_t end) {
  simd::LocalVector<R> scratch;
  simd::LocalVector<const R*> rows(static_cast<size_t>(a.n));
  simd::LocalVector<R> z(static_cast<size_t>(a.n));
  for (int64_t b = begin; b < end; ++b) {
    W* out = a.out + b * a.width;
    // (width 0: an empty tensor's data may be null, and memcpy from null is undefined even for 0 bytes)
    if (a.dim > 0) std::memcpy(out, a.inputs[0] + b * a.dim, static_cast<size_t>(a.dim) * sizeof(W));
    sample_rows(a, b, scratch, rows.data());
    W* tri = out + a.dim;
    for (int i = 1; i < a.n; ++i) {
      int j = 0;
      for (; j + 4 <= i; j += 4) dots<4>(rows[i], rows.data() + j, a.dim, z.data() + j);
      for (; j < i; ++j) dots<1>(rows[i], rows.data() + j, a.dim, z.data() + j);
      for (j = 0; j < i; ++j) L::store(tri + j, z[j]);
      tri += i;
    }
  }
}

// grad x_i = [i == 0] g[:dim] + sum over j != i of g_pair(i, j) x_j, a strip of NV vectors at column c.
template <int NV, typename W>
inline void grad_strip(const kernels::Args<W>& a, const R* const* rows, const R* pair, int i, int64_t c, const W* g,
                       W* out) {
  typename V::Reg acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = i == 0 ? V::load(g + c + v * V::kWidth) : V::set1(0.0f);
  for (int j = 0; j < a.n; ++j) {
    if (j == i) continue;
    const int hi = i > j ? i : j, lo = i > j ? j : i;
    const auto s = V::set1(pair[static_cast<int64_t>(hi) * (hi - 1) / 2 + lo]);
    for (int v = 0; v < NV; ++v) acc[v] = V::fmadd(s, V::load(rows[j] + c + int64_t{v} * V::kWidth), acc[v]);
  }
  for (int v = 0; v < NV; ++v) V::store(out + c + v * V::kWidth, acc[v]);
}

template <typename W>
void backward_range(const kernels::Args<W>& a, int64_t begin, int64_t end) {
  simd::LocalVector<R> scratch;
  simd::LocalVector<const R*> rows(static_cast<size_t>(a.n));
  const int64_t pairs = a.width - a.dim;
  simd::LocalVector<R> pair(static_cast<size_t>(pairs));
  for (int64_t b = begin; b < end; ++b) {
    const W* g = a.grad_out + b * a.width;
    for (int64_t p = 0; p < pairs; ++p) pair[p] = L::load(g + a.dim + p);
    sample_rows(a, b, scratch, rows.data());
    for (int i = 0; i < a.n; ++i) {
      W* out = a.grad_inputs[i] + b * a.dim;
      const int64_t tail = for_each_strip<V>(a.dim, [&](auto nv, int64_t c) {
        grad_strip<decltype(nv)::value>(a, rows.data(), pair.data(), i, c, g, out);
      });
      for (int64_t c = tail; c < a.dim; ++c) {
        R acc = i == 0 ? L::load(g + c) : R{0};
        for (int j = 0; j < a.n; ++j) {
          if (j == i) continue;
          const int hi = i > j ? i : j, lo = i > j ? j : i;
          acc = L::fmadd(pair[hi * (hi - 1) / 2 + lo], rows[j][c], acc);
        }
        L::store(out + c, acc);
      }
    }
  }
}
