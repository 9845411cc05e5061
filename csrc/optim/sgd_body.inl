// SGD's element update, written once for any vector type V (simd_*.inl). Included inside an anonymous namespace
// of optim_kernels.cpp, once per ISA. The order of operations is torch.optim's (see ember/optim.h).
// S: the storage of the parameter and gradient (optim_kernels.h); the state is always fp32.
template <typename V, typename S>
inline void sgd_update(const SgdPointers<S>& t, int64_t i, const SgdCoeffs& c) {
  using R = typename V::Reg;
  R p = load_param<V>(t, i);
  R g = V::load(t.grad + i);
  if (c.maximize) g = V::neg(g);
  if (c.scaled) g = V::div(g, V::set1(c.grad_scale));
  if (c.decays) g = V::add(g, V::mul(V::set1(c.weight_decay), p));
  if (c.trust != 1.0f) g = V::mul(g, V::set1(c.trust));  // LARS's layer-wise rate; 1 for SGD
  if (t.momentum_buffer != nullptr) {
    R buf = g;
    if (!c.first_step) {
      buf = V::add(V::mul(V::load(t.momentum_buffer + i), V::set1(c.momentum)),
                   V::mul(V::set1(c.one_minus_dampening), g));
    }
    V::store(t.momentum_buffer + i, buf);
    g = c.nesterov ? V::add(g, V::mul(V::set1(c.momentum), buf)) : buf;
  }
  store_param<V>(t, i, V::add(p, V::mul(V::set1(c.neg_lr), g)));
}

template <typename V, typename S>
inline void sgd_range(const SgdPointers<S>& t, int64_t begin, int64_t end, const SgdCoeffs& c) {
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) sgd_update<V, S>(t, i, c);
  for (; i < end; ++i) sgd_update<ScalarF, S>(t, i, c);
}
