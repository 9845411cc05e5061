// The epilogue's body, instantiated by epilogue_kernels.cpp (once per ISA) with the ISA's vector policy V. Included
// inside an anonymous namespace after simd_scalar.inl, the policy's simd_<isa>.inl and simd_math.inl.
//
// Each activation follows torch's definition (nn.ReLU, nn.GELU, ...) in fp32; where torch's formula would cancel,
// an equal one that does not is used: 1 + tanh(u) = 2/(1 + e^-2u) in the tanh GELU and 1 + erf(x/√2) =
// erfc(-x/√2) in the erf GELU. NaN in, NaN out, for every activation.

template <typename V>
typename V::Reg relu6(typename V::Reg v) {
  const auto zero = V::set1(0.0f), six = V::set1(6.0f);
  return V::select(V::lt(v, zero), zero, V::select(V::gt(v, six), six, v));
}

// eˣ - 1 for x <= 0 without the cancellation of subtracting 1 near 0: 2t/(1 - t) with t = tanh(x/2), whose
// denominator stays in [1, 2) there.
template <typename V>
typename V::Reg expm1_nonpositive(typename V::Reg v) {
  const typename V::Reg t = simd_math::tanh<V>(V::mul(v, V::set1(0.5f)));
  return V::div(V::add(t, t), V::sub(V::set1(1.0f), t));
}

// `alpha` and `beta` are the PostOp's parameters (ember/epilogue.h), read by the activations that take them.
// Always inlined: every caller passes a constant `act`, so the switch folds to the one activation's straight-line
// code in the caller's loop. Left to GCC, it was a call per vector that broadcast its constants again each time and
// ran the formula as one dependent chain: an erf GELU's pass took 30 cycles a vector on Sapphire Rapids.
template <typename V>
[[gnu::always_inline]] inline typename V::Reg activate(Activation act, typename V::Reg v, float alpha, float beta) {
  using R = typename V::Reg;
  const R one = V::set1(1.0f);
  switch (act) {
    case Activation::relu: return V::select(V::lt(v, V::set1(0.0f)), V::set1(0.0f), v);
    case Activation::gelu_erf: {
      // 0.5·v·(1 + erf(v/√2)) with q = erfc(|v|/√2): v - 0.5·v·q for v >= 0 and 0.5·v·q for v < 0, that is
      // max(v, 0) - 0.5·|v|·q, with no compare and blend (they share a port, which bound this pass). v is capped
      // above at 20, where q is already 0, so that +inf gives inf - 0 where inf·0 would be NaN; -inf gives NaN as in
      // torch (-inf·0), and NaN stays NaN.
      const R q = simd_math::erfc_nonnegative<V>(V::mul(V::abs(v), V::set1(0.70710678118654752f)));
      const R half_tail = V::mul(V::mul(V::set1(0.5f), V::abs(V::clamp_above(v, V::set1(20.0f)))), q);
      return V::sub(V::clamp_below(v, V::set1(0.0f)), half_tail);
    }
    case Activation::gelu_tanh: {
      // 0.5·v·(1 + tanh(u)) = v/(1 + e^-2u), u = √(2/π)·(v + 0.044715·v³).
      const R u = V::mul(V::set1(0.79788456080286536f), V::fmadd(V::mul(V::set1(0.044715f), V::mul(v, v)), v, v));
      return V::div(v, V::add(one, simd_math::exp<V>(V::mul(V::set1(-2.0f), u))));
    }
    case Activation::silu: return V::div(v, V::add(one, simd_math::exp<V>(V::neg(v))));
    case Activation::sigmoid: return V::div(one, V::add(one, simd_math::exp<V>(V::neg(v))));
    case Activation::tanh: return simd_math::tanh<V>(v);
    case Activation::hardswish: return V::div(V::mul(v, relu6<V>(V::add(v, V::set1(3.0f)))), V::set1(6.0f));
    case Activation::hardsigmoid: return V::div(relu6<V>(V::add(v, V::set1(3.0f))), V::set1(6.0f));
    case Activation::relu6: return relu6<V>(v);
    case Activation::mish: {
      // tanh(softplus(x)) = n/(n + 2) with n = eˣ(eˣ + 2); from x = 20 on it is 1 in fp32 (and n would overflow).
      const R t = simd_math::exp<V>(V::select(V::gt(v, V::set1(20.0f)), V::set1(0.0f), v));
      const R n = V::mul(t, V::add(t, V::set1(2.0f)));
      return V::select(V::gt(v, V::set1(20.0f)), v, V::mul(v, V::div(n, V::add(n, V::set1(2.0f)))));
    }
    case Activation::elu:
      return V::select(
          V::gt(v, V::set1(0.0f)), v,
          V::mul(V::set1(alpha), expm1_nonpositive<V>(V::select(V::gt(v, V::set1(0.0f)), V::set1(0.0f), v))));
    case Activation::leaky_relu: return V::select(V::lt(v, V::set1(0.0f)), V::mul(v, V::set1(alpha)), v);
    case Activation::clamp: {
      const R lo = V::set1(alpha), hi = V::set1(beta);
      return V::select(V::lt(v, lo), lo, V::select(V::gt(v, hi), hi, v));
    }
    case Activation::affine: {
      // α·x, then + β, each rounded as torch rounds x * c and x + c (and -0 stays -0 where torch keeps it).
      const R scaled = alpha == 1.0f ? v : V::mul(v, V::set1(alpha));
      return beta == 0.0f ? scaled : V::add(scaled, V::set1(beta));
    }
  }
  return v;
}

// A chain of post-ops is finished a block of columns at a time: the block's fp32 values stay in L1 while each op
// runs over all of them in a loop of its own, so the switch on the op is taken once a block and each loop is the
// op's straight-line vector code. (Dispatching per vector, inside one loop over the ops, left activate() a call
// per 8 or 16 lanes: on the VM an in-place ReLU over a ResNet-50 activation took 3x as long as it now does, and
// ResNet-50 bf16 on the Xeon ran 20-25% slower once its ReLUs moved out of oneDNN.)
constexpr int64_t kBlock = 256;

// Calls step(W{}, j) over the lanes of [0, n): W = V at each whole vector, then W = ScalarF at each of the last
// n % width lanes. Every loop of the epilogue is one of these, so its vector and tail bodies are one text.
template <typename V, typename Step>
inline void for_lanes(int64_t n, Step step) {
  int64_t j = 0;
  for (; j + V::kWidth <= n; j += V::kWidth) step(V{}, j);
  for (; j < n; ++j) step(ScalarF{}, j);
}

// v[j] = A(v[j]) for j < n.
template <typename V, Activation A>
void activate_block(float* v, int64_t n, const PostOp& op) {
  for_lanes<V>(n, [&](auto w, int64_t j) {
    using W = decltype(w);
    W::store(v + j, activate<W>(A, W::load(v + j), op.alpha, op.beta));
  });
}

// Calls body(std::integral_constant<Activation, act>{}): one instantiation per activation, each the straight-line
// code of its own.
template <typename Body>
void with_activation(Activation act, Body&& body) {
  using A = Activation;
  switch (act) {
    case A::relu: return body(std::integral_constant<A, A::relu>{});
    case A::gelu_erf: return body(std::integral_constant<A, A::gelu_erf>{});
    case A::gelu_tanh: return body(std::integral_constant<A, A::gelu_tanh>{});
    case A::silu: return body(std::integral_constant<A, A::silu>{});
    case A::sigmoid: return body(std::integral_constant<A, A::sigmoid>{});
    case A::tanh: return body(std::integral_constant<A, A::tanh>{});
    case A::hardswish: return body(std::integral_constant<A, A::hardswish>{});
    case A::hardsigmoid: return body(std::integral_constant<A, A::hardsigmoid>{});
    case A::relu6: return body(std::integral_constant<A, A::relu6>{});
    case A::mish: return body(std::integral_constant<A, A::mish>{});
    case A::elu: return body(std::integral_constant<A, A::elu>{});
    case A::leaky_relu: return body(std::integral_constant<A, A::leaky_relu>{});
    case A::clamp: return body(std::integral_constant<A, A::clamp>{});
    case A::affine: return body(std::integral_constant<A, A::affine>{});
  }
}

template <typename V>
void activate_block(const PostOp& op, float* v, int64_t n) {
  with_activation(op.activation, [&](auto a) { activate_block<V, decltype(a)::value>(v, n, op); });
}

// stored[j] (+ bias[j]) in W's lanes at j, widened to fp32.
template <typename W, typename T>
inline typename W::Reg load_sum(const T* stored, const float* bias, int64_t j) {
  typename W::Reg v = W::load(stored + j);
  return bias != nullptr ? W::add(v, W::load(bias + j)) : v;
}

// out[j] = act(sums[j] + bias[j]) in one pass: the chain of a single activation (most of them: a leading residual
// add is fused by oneDNN, and the skinny matmul's layers rarely chain two activations).
template <typename V, Activation A, typename Sums, typename Out>
void activate_row(const Row& row, const PostOp& op) {
  const auto* sums = static_cast<const Sums*>(row.sums);
  auto* out = static_cast<Out*>(row.out);
  // From bf16 to bf16 without a bias, an activation that keeps bf16 values needs no rounding on the store: the one
  // case that is a pass over a bf16 convolution's output (ResNets, MobileNets), at the memory's speed rather than
  // the rounding's.
  if constexpr (std::is_same_v<Sums, uint16_t> && std::is_same_v<Out, uint16_t> && keeps_bf16_values(A)) {
    if (row.bias == nullptr) {
      return for_lanes<V>(row.n, [&](auto w, int64_t j) {
        using W = decltype(w);
        W::store_top(out + j, activate<W>(A, W::load(sums + j), op.alpha, op.beta));
      });
    }
  }
  for_lanes<V>(row.n, [&](auto w, int64_t j) {
    using W = decltype(w);
    W::store(out + j, activate<W>(A, load_sum<W>(sums, row.bias, j), op.alpha, op.beta));
  });
}

template <typename V, typename Sums, typename Out>
void activate_row(const PostOp& op, const Row& row) {
  with_activation(op.activation, [&](auto a) { activate_row<V, decltype(a)::value, Sums, Out>(row, op); });
}

// The whole block is read before any of it is written, so `out` may be the row's sums (finish_from in place).
template <typename V, typename Sums, typename Residual, typename Out>
void finish_row_as(const Row& row) {
  if (row.num_ops == 1 && row.ops[0].kind == PostOp::Kind::activation) {
    return activate_row<V, Sums, Out>(row.ops[0], row);
  }
  alignas(64) float block[kBlock];
  const auto* sums = static_cast<const Sums*>(row.sums);
  const auto* residual = static_cast<const Residual*>(row.residual);
  auto* out = static_cast<Out*>(row.out);
  for (int64_t j0 = 0; j0 < row.n; j0 += kBlock) {
    const int64_t n = row.n - j0 < kBlock ? row.n - j0 : kBlock;
    const float* bias = row.bias != nullptr ? row.bias + j0 : nullptr;
    for_lanes<V>(n, [&](auto w, int64_t j) {
      using W = decltype(w);
      W::store(block + j, load_sum<W>(sums + j0, bias, j));
    });
    for (int64_t o = 0; o < row.num_ops; ++o) {
      const PostOp& op = row.ops[o];
      if (op.kind == PostOp::Kind::add) {
        for_lanes<V>(n, [&](auto w, int64_t j) {
          using W = decltype(w);
          W::store(block + j, W::add(W::load(block + j), W::load(residual + j0 + j)));
        });
      } else if (op.kind == PostOp::Kind::multiply) {
        for_lanes<V>(n, [&](auto w, int64_t j) {
          using W = decltype(w);
          W::store(block + j, W::mul(W::load(block + j), W::load(residual + j0 + j)));
        });
      } else {
        activate_block<V>(op, block, n);
      }
    }
    for_lanes<V>(n, [&](auto w, int64_t j) {
      using W = decltype(w);
      W::store(out + j0 + j, W::load(block + j));
    });
  }
}

template <typename V, typename Sums, typename Residual>
void finish_row_from(const Row& row) {
  if (row.out_dtype == DType::bf16) {
    finish_row_as<V, Sums, Residual, uint16_t>(row);
  } else if (row.out_dtype == DType::f16) {
    finish_row_as<V, Sums, Residual, Half>(row);
  } else {
    finish_row_as<V, Sums, Residual, float>(row);
  }
}

template <typename V, typename Sums>
void finish_row_with(const Row& row) {
  if (row.residual != nullptr && row.residual_dtype == DType::bf16) {
    finish_row_from<V, Sums, uint16_t>(row);
  } else if (row.residual != nullptr && row.residual_dtype == DType::f16) {
    finish_row_from<V, Sums, Half>(row);
  } else {
    finish_row_from<V, Sums, float>(row);
  }
}

template <typename V>
void finish_row(const Row& row) {
  if (row.sums_dtype == DType::bf16) {
    finish_row_with<V, uint16_t>(row);
  } else if (row.sums_dtype == DType::f16) {
    finish_row_with<V, Half>(row);
  } else {
    finish_row_with<V, float>(row);
  }
}
