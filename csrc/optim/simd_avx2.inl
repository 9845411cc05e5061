// Eight floats in a ymm register. Included inside an anonymous namespace of an *_avx2.cpp kernel file.
struct Avx2F {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg neg(Reg a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static Reg sqrt(Reg a) { return _mm256_sqrt_ps(a); }
  static Reg max(Reg a, Reg b) {
    // maxps returns its second operand when either is NaN; torch.maximum returns NaN.
    const Reg m = _mm256_max_ps(a, b);
    return _mm256_blendv_ps(m, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
};
