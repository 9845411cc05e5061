// Sixteen floats in a zmm register. Included inside an anonymous namespace of a kernel compilation for AVX-512.
struct Avx512F {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg load(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(Half* p, Reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static Reg load(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  // Round to nearest even on the bit pattern, NaN quieted with sign and payload kept (ember::bf16::round_bits).
  static void store(uint16_t* p, Reg v) {
#if defined(__AVX512BF16__)
    // vcvtneps2bf16 rounds and quiets NaN the same way, in one instruction where the bit arithmetic takes eight (an
    // erf GELU's pass over a bf16 output: 26% off on the Zen 5), but it reads denormals as zero: a vector holding
    // one takes the bit arithmetic.
    constexpr int kDenormal = 0x20;  // vfpclassps category: a denormal of either sign
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, kDenormal) == 0, 1)) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
      return;
    }
#endif
    store_rounding_bits(p, v);
  }
  static void store_rounding_bits(uint16_t* p, Reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 is_nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __m512i halves = _mm512_mask_or_epi32(rounded, is_nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(halves));
  }
  // The high halves alone: exact for a value bf16 represents (one widened from bf16 and only compared since).
  static void store_top(uint16_t* p, Reg v) {
    const __m512i halves = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(halves));
  }
  // Split-BF16 (ember::bf16::join / split): the float32 whose bit pattern is top << 16 | bottom, and back.
  static Reg join(const uint16_t* top, const uint16_t* bottom) {
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(top)));
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bottom)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(hi, 16), lo));
  }
  static void split(uint16_t* top, uint16_t* bottom, Reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(top), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bottom), _mm512_cvtepi32_epi16(bits));  // keeps the low half
  }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  // 1/a within 2 ulp, for a in [1, 2^126]: vrcp14ps and one Newton step, r·(2 - a·r). vdivps is one every 10-16
  // cycles on Intel's cores; the erf GELU's pass over a bf16 output ran 21% faster this way on the Xeon.
  static Reg reciprocal(Reg a) {
    const Reg r = _mm512_rcp14_ps(a);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(2.0f)));
  }
  static Reg neg(Reg a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  static Reg sqrt(Reg a) { return _mm512_sqrt_ps(a); }
  static Reg max(Reg a, Reg b) {
    // maxps returns its second operand when either is NaN; torch.maximum returns NaN.
    const __mmask16 unordered = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    return _mm512_mask_add_ps(_mm512_max_ps(a, b), unordered, a, b);
  }
  // max(x, floor) and min(x, ceiling) for a bound that is not NaN, a NaN x staying NaN: one vmaxps / vminps with x
  // second, which they return when either operand is NaN (no compare into a mask: those share one port with the
  // blends, and an erf GELU's pass is bound by it).
  static Reg clamp_below(Reg x, Reg floor) { return _mm512_max_ps(floor, x); }
  static Reg clamp_above(Reg x, Reg ceiling) { return _mm512_min_ps(ceiling, x); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }  // a·b + c, rounded once
  static Reg abs(Reg a) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MAX)));
  }
  // |magnitude| with the sign bit of `sign`: magnitude must have its sign bit clear.
  static Reg with_sign_of(Reg magnitude, Reg sign) {
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(magnitude), _mm512_and_si512(_mm512_castps_si512(sign), _mm512_set1_epi32(INT32_MIN))));
  }
  // To the nearest integer, ties to even.
  static Reg round(Reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static Reg pow2(Reg n) {
    const __m512i biased = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23));
  }
  // a·2^n for integral n in [-126, 0] (vscalefps: one instruction).
  static Reg scale_pow2(Reg a, Reg n) { return _mm512_scalef_ps(a, n); }
  // Lane masks: ordered comparisons (false where either operand is NaN), and the lanes that are NaN.
  using Mask = __mmask16;
  static Mask lt(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask gt(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask is_nan(Reg a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static Reg select(Mask m, Reg if_true, Reg if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  // Lanes added in a fixed order. (Not _mm512_reduce_add_ps: GCC 12's version trips -Wuninitialized.)
  static float hsum(Reg a) {
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  // Transposes a 16x16 block of floats held as 16 rows. Stage 1 and 2 interleave within 128-bit lanes, so that
  // rows[4g + c] holds, in its lane L, column 4L + c of rows 4g..4g+3; stage 3 and 4 then gather, for each (L, c),
  // lane L of the four groups into row 4L + c. 64 shuffles against the 256 scalar moves of an element-wise copy.
  static void transpose(Reg (&rows)[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
    }
    const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
    for (int i = 0; i < 16; i += 4) {
      rows[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i]), pd(t[i + 2])));
      rows[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i]), pd(t[i + 2])));
      rows[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i + 1]), pd(t[i + 3])));
      rows[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i + 1]), pd(t[i + 3])));
    }
    for (int c = 0; c < 4; ++c) {
      // 0x88 picks 128-bit lanes 0 and 2 of each operand, 0xdd lanes 1 and 3.
      const __m512 u0 = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0x88);
      const __m512 u1 = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0xdd);
      const __m512 u2 = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0x88);
      const __m512 u3 = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0xdd);
      t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);       // lane L = 0
      t[4 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);   // L = 1
      t[8 + c] = _mm512_shuffle_f32x4(u0, u2, 0xdd);   // L = 2
      t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xdd);  // L = 3
    }
    for (int i = 0; i < 16; ++i) rows[i] = t[i];
  }
};
