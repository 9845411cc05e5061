// Eight floats in a ymm register. Included inside an anonymous namespace of a kernel compilation for AVX2.
struct Avx2F {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  // binary16 through F16C (in every AVX2 build: EMBER_ISA_FLAGS_avx2).
  static Reg load(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(Half* p, Reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static Reg load(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // Round to nearest even on the bit pattern, NaN quieted with sign and payload kept (ember::bf16::round_bits).
  static void store(uint16_t* p, Reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
    const __m256i is_nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    const __m256i halves = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // packus works per 128-bit lane: elements 0-3 land in the low quarter, 4-7 in the third.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  // The high halves alone: exact for a value bf16 represents (one widened from bf16 and only compared since).
  static void store_top(uint16_t* p, Reg v) {
    const __m256i halves = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  // Split-BF16 (ember::bf16::join / split): the float32 whose bit pattern is top << 16 | bottom, and back.
  static Reg join(const uint16_t* top, const uint16_t* bottom) {
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(top)));
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bottom)));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(hi, 16), lo));
  }
  static void split(uint16_t* top, uint16_t* bottom, Reg v) {
    // Per 128-bit lane: the four low halves into the low 8 bytes, the four high halves into the high 8; then the
    // quarters reordered to (low halves 0-3, 4-7 | high halves 0-3, 4-7).
    const __m256i gather = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(_mm256_castps_si256(v), gather), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bottom), _mm256_castsi256_si128(halves));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(top), _mm256_extracti128_si256(halves, 1));
  }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg reciprocal(Reg a) { return _mm256_div_ps(_mm256_set1_ps(1.0f), a); }  // exact: vrcpps has 12 bits
  static Reg neg(Reg a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static Reg sqrt(Reg a) { return _mm256_sqrt_ps(a); }
  // As Avx512F's: x second, which maxps / minps return when either operand is NaN.
  static Reg clamp_below(Reg x, Reg floor) { return _mm256_max_ps(floor, x); }
  static Reg clamp_above(Reg x, Reg ceiling) { return _mm256_min_ps(ceiling, x); }
  static Reg max(Reg a, Reg b) {
    // maxps returns its second operand when either is NaN; torch.maximum returns NaN.
    const Reg m = _mm256_max_ps(a, b);
    return _mm256_blendv_ps(m, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }  // a·b + c, rounded once
  static Reg abs(Reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  // |magnitude| with the sign bit of `sign`: magnitude must have its sign bit clear.
  static Reg with_sign_of(Reg magnitude, Reg sign) {
    return _mm256_or_ps(magnitude, _mm256_and_ps(sign, _mm256_set1_ps(-0.0f)));
  }
  // To the nearest integer, ties to even.
  static Reg round(Reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static Reg pow2(Reg n) {
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
  }
  // a·2^n for integral n in [-126, 0].
  static Reg scale_pow2(Reg a, Reg n) { return mul(a, pow2(n)); }
  // Lane masks (all ones where true): ordered comparisons (false where either operand is NaN), and NaN lanes.
  using Mask = __m256;
  static Mask lt(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Mask gt(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Mask is_nan(Reg a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static Reg select(Mask m, Reg if_true, Reg if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  // Lanes added in a fixed order (results must not depend on anything but the data).
  static float hsum(Reg a) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  // Transposes an 8x8 block of floats held as 8 rows. Unpacks and shuffles within 128-bit lanes leave u[4g + c]
  // holding column c of rows 4g..4g+3 in its low lane and column c + 4 in its high one; the lanes of u[c] and
  // u[4 + c] then make rows c and c + 4.
  static void transpose(Reg (&rows)[8]) {
    Reg t[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
    }
    Reg u[8];
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      rows[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      rows[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
};
