// Adam's element update, written once for any vector type V (simd_*.inl). Included inside an anonymous namespace
// of optim_kernels.cpp, once per ISA. The order of operations is torch.optim's (see ember/optim.h).
// S: the storage of the parameter and gradient (optim_kernels.h); the moments are always fp32.
template <typename V, typename S>
inline void adam_update(const AdamPointers<S>& t, int64_t i, const AdamCoeffs& c) {
  using R = typename V::Reg;
  R p = load_param<V>(t, i);
  R g = V::load(t.grad + i);
  if (c.maximize) g = V::neg(g);
  if (c.scaled) g = V::div(g, V::set1(c.inv_grad_scale_denominator));
  if (c.decoupled) {
    p = V::mul(p, V::set1(c.decay_factor));
  } else if (c.decays) {
    g = V::add(g, V::mul(V::set1(c.weight_decay), p));
  }
  R m = V::load(t.exp_avg + i);
  m = V::add(m, V::mul(V::set1(c.one_minus_beta1), V::sub(g, m)));
  R v = V::load(t.exp_avg_sq + i);
  v = V::add(V::mul(v, V::set1(c.beta2)), V::mul(V::mul(V::set1(c.one_minus_beta2), g), g));
  R v_hat = v;
  if (c.amsgrad) {
    v_hat = V::max(V::load(t.max_exp_avg_sq + i), v);
    V::store(t.max_exp_avg_sq + i, v_hat);
  }
  const R denom = V::add(V::div(V::sqrt(v_hat), V::set1(c.bias_correction2_sqrt)), V::set1(c.eps));
  p = V::add(p, V::mul(V::set1(c.neg_step_size), V::div(m, denom)));
  V::store(t.exp_avg + i, m);
  V::store(t.exp_avg_sq + i, v);
  store_param<V>(t, i, p);
}

// Full vectors of V from `begin` (a multiple of the vector width within the tensor), then the tail one by one.
template <typename V, typename S>
inline void adam_range(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) adam_update<V, S>(t, i, c);
  for (; i < end; ++i) adam_update<ScalarF, S>(t, i, c);
}
