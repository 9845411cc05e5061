// Adagrad's element update, written once for any vector type V (simd_*.inl). Included inside an anonymous
// namespace of each adagrad_fp32_<isa>.cpp. The order of operations is torch.optim's (see ember/optim.h).
// P: float (fp32 parameters and gradients) or uint16_t (bf16 bit patterns); the state is always fp32.
template <typename V, typename P>
inline void adagrad_update(const AdagradPointersT<P>& t, int64_t i, const AdagradCoeffs& c) {
  using R = typename V::Reg;
  R p = V::load(t.param + i);
  R g = V::load(t.grad + i);
  if (c.maximize) g = V::neg(g);
  if (c.scaled) g = V::div(g, V::set1(c.grad_scale));
  if (c.weight_decay != 0.0f) g = V::add(g, V::mul(V::set1(c.weight_decay), p));
  const R sum = V::add(V::load(t.state_sum + i), V::mul(g, g));
  const R std = V::add(V::sqrt(sum), V::set1(c.eps));
  V::store(t.state_sum + i, sum);
  V::store(t.param + i, V::add(p, V::mul(V::set1(c.neg_clr), V::div(g, std))));
}

template <typename V, typename P>
inline void adagrad_range(const AdagradPointersT<P>& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) adagrad_update<V, P>(t, i, c);
  for (; i < end; ++i) adagrad_update<ScalarF, P>(t, i, c);
}
