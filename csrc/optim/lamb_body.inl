// Lamb's two passes and the sums of squares LARS needs, written once for any vector type V (simd_*.inl) and any
// storage S (optim_kernels.h). Included inside the anonymous namespace of optim_kernels.cpp. See ember/optim.h for
// the formulas.
template <typename V>
inline typename V::Reg lamb_direction(typename V::Reg p, typename V::Reg m, typename V::Reg v, const LambCoeffs& c) {
  const typename V::Reg m_hat = V::mul(m, V::set1(c.inv_bias_correction1));
  const typename V::Reg denom = V::add(V::sqrt(V::mul(v, V::set1(c.inv_bias_correction2))), V::set1(c.eps));
  typename V::Reg u = V::div(m_hat, denom);
  if (c.decays) u = V::add(u, V::mul(V::set1(c.weight_decay), p));
  return u;
}

template <typename V, typename S>
inline void lamb_moments(const LambPointers<S>& t, int64_t i, const LambCoeffs& c, typename V::Reg& acc_p,
                         typename V::Reg& acc_u) {
  using R = typename V::Reg;
  const R p = load_param<V>(t, i);
  R g = V::load(t.grad + i);
  if (c.maximize) g = V::neg(g);
  if (c.scaled) g = V::div(g, V::set1(c.grad_scale));
  R m = V::load(t.exp_avg + i);
  m = V::add(m, V::mul(V::set1(c.one_minus_beta1), V::sub(g, m)));
  R v = V::load(t.exp_avg_sq + i);
  v = V::add(V::mul(v, V::set1(c.beta2)), V::mul(V::mul(V::set1(c.one_minus_beta2), g), g));
  V::store(t.exp_avg + i, m);
  V::store(t.exp_avg_sq + i, v);
  const R u = lamb_direction<V>(p, m, v, c);
  if (t.direction != nullptr) V::store(t.direction + i, u);
  acc_p = V::add(acc_p, V::mul(p, p));
  acc_u = V::add(acc_u, V::mul(u, u));
}

template <typename V, typename S>
inline void lamb_moments_range(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                               double* u_sq) {
  typename V::Reg acc_p = V::set1(0.0f), acc_u = V::set1(0.0f);
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) lamb_moments<V, S>(t, i, c, acc_p, acc_u);
  double sum_p = V::hsum(acc_p), sum_u = V::hsum(acc_u);
  for (; i < end; ++i) {
    float tail_p = 0.0f, tail_u = 0.0f;
    lamb_moments<ScalarF, S>(t, i, c, tail_p, tail_u);
    sum_p += tail_p;
    sum_u += tail_u;
  }
  *p_sq = sum_p;
  *u_sq = sum_u;
}

template <typename V, bool Kept, typename S>
inline void lamb_apply(const LambPointers<S>& t, int64_t i, const LambCoeffs& c) {
  const typename V::Reg p = load_param<V>(t, i);
  typename V::Reg u;
  if constexpr (Kept) {
    u = V::load(t.direction + i);
  } else {
    u = lamb_direction<V>(p, V::load(t.exp_avg + i), V::load(t.exp_avg_sq + i), c);
  }
  store_param<V>(t, i, V::add(p, V::mul(V::set1(c.neg_lr_trust), u)));
}

template <typename V, bool Kept, typename S>
inline void lamb_apply_loop(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) lamb_apply<V, Kept, S>(t, i, c);
  for (; i < end; ++i) lamb_apply<ScalarF, Kept, S>(t, i, c);
}

// The same u either way (the first pass stored what lamb_direction computed), so keeping it changes no result.
template <typename V, typename S>
inline void lamb_apply_range(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  if (t.direction != nullptr) {
    lamb_apply_loop<V, true, S>(t, begin, end, c);
  } else {
    lamb_apply_loop<V, false, S>(t, begin, end, c);
  }
}

template <typename V, typename S>
inline void sum_squares(const NormPointers<S>& t, int64_t i, typename V::Reg& acc_p, typename V::Reg& acc_g) {
  const typename V::Reg p = load_param<V>(t, i), g = V::load(t.grad + i);
  acc_p = V::add(acc_p, V::mul(p, p));
  acc_g = V::add(acc_g, V::mul(g, g));
}

template <typename V, typename S>
inline void sum_squares_range(const NormPointers<S>& t, int64_t begin, int64_t end, double* p_sq, double* g_sq) {
  typename V::Reg acc_p = V::set1(0.0f), acc_g = V::set1(0.0f);
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) sum_squares<V, S>(t, i, acc_p, acc_g);
  double sum_p = V::hsum(acc_p), sum_g = V::hsum(acc_g);
  for (; i < end; ++i) {
    float tail_p = 0.0f, tail_g = 0.0f;
    sum_squares<ScalarF, S>(t, i, tail_p, tail_g);
    sum_p += tail_p;
    sum_g += tail_g;
  }
  *p_sq = sum_p;
  *g_sq = sum_g;
}
