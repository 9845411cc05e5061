// The row normalisations (ember/norm.h row_norm), written once for the file's float vector type V (`using V = ...`
// before inclusion, inside a namespace of norm_kernels.cpp, once per ISA, after the vector types). Storage types
// are float or uint16_t (bfloat16 bits); arithmetic is float throughout.
using L = Lane<V>;

// h = x + r, stored as H: rounded to bfloat16 when H is, as torch's add rounds the sum the norm then reads.
template <typename X, typename S, typename H>
void add_row(const X* x, const S* r, H* h, int64_t n) {
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(h + i, V::add(V::load(x + i), V::load(r + i)));
  for (; i < n; ++i) L::store(h + i, L::add(L::load(x + i), L::load(r + i)));
}

// The sum of d[i] = (h[i] - pivot) - delta (squares = false) or of d[i]², over two vector accumulators: the adds of
// one do not wait for the other's. A mean is pivot + delta, a row's first element plus the mean of the differences
// from it: h[i] - pivot is exact where h[i] is near pivot, and the mean of a row far from zero is not rounded to the
// float32 spacing of its offset, which can exceed the spread the variance measures.
template <bool squares, typename H>
float row_sum(const H* h, int64_t n, float pivot, float delta) {
  const auto p_v = V::set1(pivot), d_v = V::set1(delta);
  auto term = [&](const H* p) {
    const auto v = V::sub(V::sub(V::load(p), p_v), d_v);
    return squares ? V::mul(v, v) : v;
  };
  auto a0 = V::set1(0.0f), a1 = V::set1(0.0f);
  constexpr int64_t kPair = int64_t{2} * V::kWidth;
  int64_t i = 0;
  for (; i + kPair <= n; i += kPair) {
    a0 = V::add(a0, term(h + i));
    a1 = V::add(a1, term(h + i + V::kWidth));
  }
  if (i + V::kWidth <= n) {
    a0 = V::add(a0, term(h + i));
    i += V::kWidth;
  }
  float sum = V::hsum(V::add(a0, a1));
  for (; i < n; ++i) {
    const float v = (L::load(h + i) - pivot) - delta;
    sum += squares ? v * v : v;
  }
  return sum;
}

// y = ((h - pivot) - delta) * rstd * w + b, the mean pivot + delta as above (0 and 0 for RMSNorm); w, b null: 1
// and 0. (Not h * rstd - mean * rstd, one instruction shorter: for a row far from zero both products are large and
// their difference loses the digits.)
template <typename H, typename W, typename Y>
void normalize_row(const H* h, const W* w, const W* b, Y* y, int64_t n, float pivot, float delta, float rstd) {
  const auto p_v = V::set1(pivot), d_v = V::set1(delta), rstd_v = V::set1(rstd);
  const auto one = V::set1(1.0f), zero = V::set1(0.0f);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const auto normalized = V::mul(V::sub(V::sub(V::load(h + i), p_v), d_v), rstd_v);
    V::store(y + i, V::fmadd(normalized, w != nullptr ? V::load(w + i) : one, b != nullptr ? V::load(b + i) : zero));
  }
  for (; i < n; ++i) {
    const float normalized = ((L::load(h + i) - pivot) - delta) * rstd;
    L::store(y + i, L::fmadd(normalized, w != nullptr ? L::load(w + i) : 1.0f, b != nullptr ? L::load(b + i) : 0.0f));
  }
}

// y rounded to bfloat16 into low, from the row just written (still in cache).
void round_row(const float* y, uint16_t* low, int64_t n) {
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(low + i, V::load(y + i));
  for (; i < n; ++i) L::store(low + i, L::load(y + i));
}

// Calls f with a null pointer of the storage type a bf16 flag names: one switch turns runtime dtypes into the
// template arguments of the bodies above.
template <typename F>
void with_storage(bool bf16, F&& f) {
  if (bf16) {
    f(static_cast<uint16_t*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

template <typename T, typename P>
T* row_of(const kernels::Rows<P>& rows, int64_t r) {
  return static_cast<T*>(rows.data) + r * rows.stride;
}

void row_norm(const kernels::RowNormArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n = a.cols;
  const bool summed = a.residual.data != nullptr;
  // h where the caller does not keep it: one row, reused. Its storage type is the sum's (a.sum.bf16).
  simd::LocalVector<uint32_t> scratch(summed && a.sum.data == nullptr ? static_cast<size_t>(n) : 0);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const void* h = nullptr;
    bool h_bf16 = a.x.bf16;
    if (!summed) {
      with_storage(a.x.bf16, [&](auto* x_type) { h = row_of<const std::remove_pointer_t<decltype(x_type)>>(a.x, r); });
    } else {
      with_storage(a.x.bf16, [&](auto* x_type) {
        using X = std::remove_pointer_t<decltype(x_type)>;
        with_storage(a.residual.bf16, [&](auto* r_type) {
          using S = std::remove_pointer_t<decltype(r_type)>;
          with_storage(a.sum.bf16, [&](auto* h_type) {
            using H = std::remove_pointer_t<decltype(h_type)>;
            H* sum = a.sum.data != nullptr ? row_of<H>(a.sum, r) : reinterpret_cast<H*>(scratch.data());
            add_row(row_of<const X>(a.x, r), row_of<const S>(a.residual, r), sum, n);
            h = sum;
          });
        });
      });
      h_bf16 = a.sum.bf16;
    }
    with_storage(h_bf16, [&](auto* h_type) {
      using H = std::remove_pointer_t<decltype(h_type)>;
      const H* hr = static_cast<const H*>(h);
      float pivot = 0.0f, delta = 0.0f;
      if (!a.rms) {
        pivot = L::load(hr);
        delta = row_sum<false>(hr, n, pivot, 0.0f) / static_cast<float>(n);
      }
      const float rstd = 1.0f / std::sqrt(row_sum<true>(hr, n, pivot, delta) / static_cast<float>(n) + a.eps);
      with_storage(a.params_bf16, [&](auto* w_type) {
        using W = std::remove_pointer_t<decltype(w_type)>;
        with_storage(a.out.bf16, [&](auto* y_type) {
          using Y = std::remove_pointer_t<decltype(y_type)>;
          normalize_row(hr, static_cast<const W*>(a.weight), static_cast<const W*>(a.bias), row_of<Y>(a.out, r), n,
                        pivot, delta, rstd);
        });
      });
    });
    if (a.out_bf16.data != nullptr) round_row(row_of<const float>(a.out, r), row_of<uint16_t>(a.out_bf16, r), n);
  }
}
