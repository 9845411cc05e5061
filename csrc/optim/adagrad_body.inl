// Adagrad's element update, written once for any vector type V (simd_*.inl). Included inside an anonymous
// namespace of optim_kernels.cpp, once per ISA. The order of operations is torch.optim's (see ember/optim.h).
// S: the storage of the parameter and gradient (optim_kernels.h); the state is always fp32.
template <typename V, typename S>
inline void adagrad_update(const AdagradPointers<S>& t, int64_t i, const AdagradCoeffs& c) {
  using R = typename V::Reg;
  R p = load_param<V>(t, i);
  R g = V::load(t.grad + i);
  if (c.maximize) g = V::neg(g);
  if (c.scaled) g = V::div(g, V::set1(c.grad_scale));
  if (c.decays) g = V::add(g, V::mul(V::set1(c.weight_decay), p));
  const R sum = V::add(V::load(t.state_sum + i), V::mul(g, g));
  const R std = V::add(V::sqrt(sum), V::set1(c.eps));
  V::store(t.state_sum + i, sum);
  store_param<V>(t, i, V::add(p, V::mul(V::set1(c.neg_clr), V::div(g, std))));
}

template <typename V, typename S>
inline void adagrad_range(const AdagradPointers<S>& t, int64_t begin, int64_t end, const AdagradCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) adagrad_update<V, S>(t, i, c);
  for (; i < end; ++i) adagrad_update<ScalarF, S>(t, i, c);
}
