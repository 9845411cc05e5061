// exp, tanh and erfc in fp32 lanes, for any of the vector policies (ScalarF, Avx2F, Avx512F): what ember's own
// kernels need for their activations (csrc/epilogue/). Included inside an anonymous namespace after the policies.
//
// Accuracy, measured against float64 over the whole float range (tests/cpp/test_epilogue_rows.cpp): exp within
// 3 ulp, tanh within 2 ulp, erfc_nonnegative within 1.5e-7 absolute. Results below about 2.4e-38 are flushed to
// zero, as the AMX and AVX512-BF16 instructions of the kernels around them do with denormals. NaN in, NaN out.

namespace simd_math {

// ln 2 in two parts: n·kLn2Hi is exact for |n| <= 2^9, so x - n·ln 2 loses nothing to rounding.
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kLog2e = 1.44269504088896341f;
// Where e^x leaves the normal floats: above kExpMax it overflows (ln FLT_MAX); below about -86.99, where the
// reduction step would need 2^-127, it is flushed to zero (kExpMin keeps the integer conversion in range).
constexpr float kExpMax = 88.72283935546875f;
constexpr float kExpMin = -87.0f;

/// e^x. x = n·ln 2 + r with n integral and |r| <= ln(2)/2; e^r by its Taylor series to r^7 (the first term left
/// out is below 2^-27 of the sum), times 2^n built in the exponent field, as 2^(n-1)·2 so that n = 128 (just
/// below kExpMax) needs no special case.
template <typename V>
typename V::Reg exp(typename V::Reg x) {
  using R = typename V::Reg;
  const R clamped = V::select(V::gt(x, V::set1(kExpMax)), V::set1(kExpMax),
                              V::select(V::lt(x, V::set1(kExpMin)), V::set1(kExpMin), x));
  const R safe = V::select(V::is_nan(x), V::set1(0.0f), clamped);  // NaN never reaches the integer conversion
  const R n = V::round(V::mul(safe, V::set1(kLog2e)));
  R r = V::fmadd(n, V::set1(-kLn2Hi), safe);
  r = V::fmadd(n, V::set1(-kLn2Lo), r);
  R p = V::set1(1.0f / 5040);
  p = V::fmadd(p, r, V::set1(1.0f / 720));
  p = V::fmadd(p, r, V::set1(1.0f / 120));
  p = V::fmadd(p, r, V::set1(1.0f / 24));
  p = V::fmadd(p, r, V::set1(1.0f / 6));
  p = V::fmadd(p, r, V::set1(0.5f));
  p = V::fmadd(p, r, V::set1(1.0f));
  p = V::fmadd(p, r, V::set1(1.0f));
  const R scaled = V::mul(V::mul(p, V::pow2(V::sub(n, V::set1(1.0f)))), V::set1(2.0f));
  R result = V::select(V::gt(x, V::set1(kExpMax)), V::set1(__builtin_inff()), scaled);
  result = V::select(V::lt(x, V::set1(kExpMin)), V::set1(0.0f), result);
  return V::select(V::is_nan(x), x, result);
}

/// tanh(x). Below |x| = 0.625, x + x^3·P(x^2), with P a degree-4 minimax fit of (tanh(x) - x)/x^3 made for
/// ember (under 1 ulp there, where 1 - 2/(e^2|x| + 1) would cancel); above, 1 - 2/(e^2|x| + 1), which is 1 from
/// |x| ~ 9 on. The sign is x's.
/// e^x for x <= 0 (-inf included): the softmax's exponent, a score less its row's maximum. The reduction of exp,
/// e^r by its Taylor series to r^6 (relative error about 2^-23), scaled by 2^n in one step (vscalefps on AVX-512).
/// Below -87.3 (where e^x leaves the normal floats) it gives 0, exactly 0 for -inf; NaN stays NaN. About half the
/// instructions of exp, which must also handle overflow: in an attention kernel this is the softmax's inner loop.
template <typename V>
typename V::Reg exp_nonpositive(typename V::Reg x) {
  using R = typename V::Reg;
  const R floor = V::set1(-87.3f);
  const R c = V::clamp_below(x, floor);  // NaN comes through
  const R n = V::round(V::mul(c, V::set1(kLog2e)));
  R r = V::fmadd(n, V::set1(-kLn2Hi), c);
  r = V::fmadd(n, V::set1(-kLn2Lo), r);
  R p = V::set1(1.0f / 720);
  p = V::fmadd(p, r, V::set1(1.0f / 120));
  p = V::fmadd(p, r, V::set1(1.0f / 24));
  p = V::fmadd(p, r, V::set1(1.0f / 6));
  p = V::fmadd(p, r, V::set1(0.5f));
  p = V::fmadd(p, r, V::set1(1.0f));
  p = V::fmadd(p, r, V::set1(1.0f));
  return V::select(V::lt(x, floor), V::set1(0.0f), V::scale_pow2(p, n));
}

template <typename V>
typename V::Reg tanh(typename V::Reg x) {
  using R = typename V::Reg;
  const R a = V::abs(x);
  const R z = V::mul(a, a);
  R p = V::set1(-0.00570499f);
  p = V::fmadd(p, z, V::set1(0.02063909f));
  p = V::fmadd(p, z, V::set1(-0.05373972f));
  p = V::fmadd(p, z, V::set1(0.13331442f));
  p = V::fmadd(p, z, V::set1(-0.3333328f));
  const R small = V::fmadd(V::mul(z, a), p, a);
  const R large = V::sub(V::set1(1.0f), V::div(V::set1(2.0f), V::add(exp<V>(V::add(a, a)), V::set1(1.0f))));
  const R magnitude = V::select(V::lt(a, V::set1(0.625f)), small, large);
  return V::select(V::is_nan(x), x, V::with_sign_of(magnitude, x));
}

/// erfc(a) for a >= 0 (NaN for NaN), by Abramowitz and Stegun's 7.1.26: t·(a1 + t·(a2 + ...))·e^(-a^2) with
/// t = 1/(1 + p·a), absolute error below 1.5e-7 (oneDNN's GELU uses the same formula). Computing erfc directly
/// keeps 1 + erf(x) = erfc(-x) free of cancellation for negative x. -a^2 is never positive, so e^(-a^2) takes
/// exp_nonpositive (2^-23 relative, about half exp's instructions: an erf GELU's pass over a bf16 output ran
/// 14% faster on Sapphire Rapids). t takes the policy's reciprocal (vrcp14ps and a Newton step on AVX-512, within
/// 2 ulp), on a capped at 10, where erfc is already flushed to 0 (e^-100): the Newton step of an infinite a would
/// be 0·inf.
template <typename V>
typename V::Reg erfc_nonnegative(typename V::Reg a) {
  using R = typename V::Reg;
  const R capped = V::clamp_above(a, V::set1(10.0f));  // NaN stays NaN
  const R t = V::reciprocal(V::fmadd(V::set1(0.3275911f), capped, V::set1(1.0f)));
  R p = V::set1(1.061405429f);
  p = V::fmadd(p, t, V::set1(-1.453152027f));
  p = V::fmadd(p, t, V::set1(1.421413741f));
  p = V::fmadd(p, t, V::set1(-0.284496736f));
  p = V::fmadd(p, t, V::set1(0.254829592f));
  return V::mul(V::mul(t, p), exp_nonpositive<V>(V::neg(V::mul(capped, capped))));
}

}  // namespace simd_math
