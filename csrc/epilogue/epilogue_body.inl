// The body every ISA file of the epilogue instantiates with its vector policy V. Included inside an anonymous
// namespace after simd_scalar.inl, the policy's simd_<isa>.inl and simd_math.inl.
//
// Each activation follows torch's definition (nn.ReLU, nn.GELU, ...) in fp32; where torch's formula would cancel,
// an equal one that does not is used: 1 + tanh(u) = 2/(1 + e^-2u) in the tanh GELU and 1 + erf(x/√2) =
// erfc(-x/√2) in the erf GELU. NaN in, NaN out, for every activation.

template <typename V>
typename V::Reg relu6(typename V::Reg v) {
  const auto zero = V::set1(0.0f), six = V::set1(6.0f);
  return V::select(V::lt(v, zero), zero, V::select(V::gt(v, six), six, v));
}

template <typename V>
typename V::Reg activate(Activation act, typename V::Reg v) {
  using R = typename V::Reg;
  const R one = V::set1(1.0f);
  switch (act) {
    case Activation::relu: return V::select(V::lt(v, V::set1(0.0f)), V::set1(0.0f), v);
    case Activation::gelu_erf: {
      // 0.5·v·(1 + erf(v/√2)): erfc(|v|/√2) = q gives 2 - q for v >= 0 and q for v < 0.
      const R q = simd_math::erfc_nonnegative<V>(V::mul(V::abs(v), V::set1(0.70710678118654752f)));
      const R one_plus_erf = V::select(V::lt(v, V::set1(0.0f)), q, V::sub(V::set1(2.0f), q));
      return V::mul(V::mul(V::set1(0.5f), v), one_plus_erf);
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
  }
  return v;
}

// Columns [j, n) in steps of V's width, as far as whole steps go; returns where it stopped.
template <typename V, typename Out, typename Residual>
int64_t finish_span(const Row& row, int64_t j) {
  const auto* residual = static_cast<const Residual*>(row.residual);
  auto* out = static_cast<Out*>(row.out);
  for (; j + V::kWidth <= row.n; j += V::kWidth) {
    typename V::Reg v = V::load(row.sums + j);
    if (row.bias != nullptr) v = V::add(v, V::load(row.bias + j));
    for (int64_t o = 0; o < row.num_ops; ++o) {
      const PostOp& op = row.ops[o];
      v = op.kind == PostOp::Kind::add ? V::add(v, V::load(residual + j)) : activate<V>(op.activation, v);
    }
    V::store(out + j, v);
  }
  return j;
}

template <typename V, typename Out, typename Residual>
void finish_row_as(const Row& row) {
  const int64_t j = finish_span<V, Out, Residual>(row, 0);
  finish_span<ScalarF, Out, Residual>(row, j);  // the last n % width columns
}

template <typename V, typename Out>
void finish_row_to(const Row& row) {
  if (row.residual != nullptr && row.residual_dtype == DType::bf16) {
    finish_row_as<V, Out, uint16_t>(row);
  } else {
    finish_row_as<V, Out, float>(row);
  }
}

template <typename V>
void finish_row(const Row& row) {
  if (row.out_dtype == DType::bf16) {
    finish_row_to<V, uint16_t>(row);
  } else {
    finish_row_to<V, float>(row);
  }
}
