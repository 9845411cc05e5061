// Lamb's two passes and the sums of squares LARS needs, written once for any vector type V (simd_*.inl).
// Included inside an anonymous namespace of each lamb_fp32_<isa>.cpp. See ember/optim.h for the formulas.
template <typename V>
inline typename V::Reg lamb_direction(typename V::Reg p, typename V::Reg m, typename V::Reg v, const LambCoeffs& c) {
  const typename V::Reg m_hat = V::div(m, V::set1(c.bias_correction1));
  const typename V::Reg denom = V::add(V::sqrt(V::div(v, V::set1(c.bias_correction2))), V::set1(c.eps));
  typename V::Reg u = V::div(m_hat, denom);
  if (c.weight_decay != 0.0f) u = V::add(u, V::mul(V::set1(c.weight_decay), p));
  return u;
}

template <typename V>
inline void lamb_moments(const LambPointers& t, int64_t i, const LambCoeffs& c, typename V::Reg& acc_p,
                         typename V::Reg& acc_u) {
  using R = typename V::Reg;
  const R p = V::load(t.param + i);
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
  acc_p = V::add(acc_p, V::mul(p, p));
  acc_u = V::add(acc_u, V::mul(u, u));
}

template <typename V>
inline void lamb_moments_range(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                               double* u_sq) {
  typename V::Reg acc_p = V::set1(0.0f), acc_u = V::set1(0.0f);
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) lamb_moments<V>(t, i, c, acc_p, acc_u);
  double sum_p = V::hsum(acc_p), sum_u = V::hsum(acc_u);
  for (; i < end; ++i) {
    float tail_p = 0.0f, tail_u = 0.0f;
    lamb_moments<ScalarF>(t, i, c, tail_p, tail_u);
    sum_p += tail_p;
    sum_u += tail_u;
  }
  *p_sq = sum_p;
  *u_sq = sum_u;
}

template <typename V>
inline void lamb_apply(const LambPointers& t, int64_t i, const LambCoeffs& c) {
  const typename V::Reg p = V::load(t.param + i);
  const typename V::Reg u = lamb_direction<V>(p, V::load(t.exp_avg + i), V::load(t.exp_avg_sq + i), c);
  V::store(t.param + i, V::add(p, V::mul(V::set1(c.neg_lr_trust), u)));
}

template <typename V>
inline void lamb_apply_range(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) lamb_apply<V>(t, i, c);
  for (; i < end; ++i) lamb_apply<ScalarF>(t, i, c);
}

template <typename V>
inline void sum_squares_range(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq) {
  typename V::Reg acc_a = V::set1(0.0f), acc_b = V::set1(0.0f);
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    const typename V::Reg x = V::load(a + i), y = V::load(b + i);
    acc_a = V::add(acc_a, V::mul(x, x));
    acc_b = V::add(acc_b, V::mul(y, y));
  }
  double sum_a = V::hsum(acc_a), sum_b = V::hsum(acc_b);
  for (; i < end; ++i) {
    sum_a += static_cast<double>(a[i] * a[i]);
    sum_b += static_cast<double>(b[i] * b[i]);
  }
  *a_sq = sum_a;
  *b_sq = sum_b;
}
