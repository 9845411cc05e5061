// Sixteen floats in a zmm register. Included inside an anonymous namespace of an *_avx512.cpp kernel file.
struct Avx512F {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg neg(Reg a) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))); }
  static Reg sqrt(Reg a) { return _mm512_sqrt_ps(a); }
  static Reg max(Reg a, Reg b) {
    // maxps returns its second operand when either is NaN; torch.maximum returns NaN.
    const __mmask16 unordered = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    return _mm512_mask_add_ps(_mm512_max_ps(a, b), unordered, a, b);
  }
  // Lanes added in a fixed order. (Not _mm512_reduce_add_ps: GCC 12's version trips -Wuninitialized.)
  static float hsum(Reg a) {
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
};
