// One float as a "vector" of width 1: the reference path, and the tail loop of the wide paths. Included inside an
// anonymous namespace of each kernel compilation (simd/kernel_simd.inl), so every ISA gets its own copy.

// IEEE binary16 storage, a type of its own beside bf16's uint16_t bit patterns: the policies' load and store pick
// the conversion by the pointer's type.
struct Half {
  uint16_t bits;
};

// binary16 -> float32, exact.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000U) << 16;
  const uint32_t exponent = (h >> 10) & 0x1FU, mantissa = h & 0x3FFU;
  uint32_t bits;
  if (exponent == 0x1FU) {
    bits = sign | 0x7F800000U | (mantissa << 13);  // infinity, NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112U) << 23) | (mantissa << 13);
  } else {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal: exact
    return sign != 0 ? -magnitude : magnitude;
  }
  float x;
  __builtin_memcpy(&x, &bits, sizeof x);
  return x;
}

// float32 -> binary16, to nearest even; beyond the largest finite half (65504) to infinity; NaN quieted with its
// sign and top payload bits: what F16C's vcvtps2ph does, so every path stores the same bits.
inline uint16_t float_to_half(float x) {
  uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000U);
  const uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (magnitude > 0x7F800000U) return static_cast<uint16_t>(sign | 0x7E00U | ((magnitude >> 13) & 0x3FFU));
  if (magnitude >= 0x477FF000U) return static_cast<uint16_t>(sign | 0x7C00U);  // rounds past 65504
  if (magnitude >= 0x38800000U) {  // a normal half: rebias the exponent (-112), round the 13 dropped bits
    const uint32_t odd = (magnitude >> 13) & 1U;
    return static_cast<uint16_t>(sign | ((magnitude + 0xC8000FFFU + odd) >> 13));
  }
  float scaled;  // subnormal or zero: the count of 2^-24 units, rounded to nearest even by the FPU's default mode
  __builtin_memcpy(&scaled, &magnitude, sizeof scaled);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(__builtin_nearbyintf(scaled * 0x1p24f)));
}

struct ScalarF {
  using Reg = float;
  static constexpr int kWidth = 1;
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg v) { *p = v; }
  // bf16 storage (uint16_t bit patterns): widening is exact; narrowing rounds to nearest even, NaN stays NaN
  // (the rule of ember::bf16::round_bits).
  static Reg load(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float x;
    __builtin_memcpy(&x, &bits, sizeof x);
    return x;
  }
  // A 1x1 block is its own transpose (the vector types' transpose, for code written once for every width).
  static void transpose(Reg (&)[1]) {}
  // a·2^n for integral n in [-126, 0].
  static Reg scale_pow2(Reg a, Reg n) { return a * pow2(n); }
  static void store(uint16_t* p, Reg v) {
    uint32_t bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7FFFFFFFU) > 0x7F800000U) {
      *p = static_cast<uint16_t>((bits >> 16) | 0x0040U);
    } else {
      *p = static_cast<uint16_t>((bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16);
    }
  }
  static Reg load(const Half* p) { return half_to_float(p->bits); }
  static void store(Half* p, Reg v) { p->bits = float_to_half(v); }
  // The high half alone: exact for a value bf16 represents (one widened from bf16 and only compared since).
  static void store_top(uint16_t* p, Reg v) {
    uint32_t bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    *p = static_cast<uint16_t>(bits >> 16);
  }
  // Split-BF16 (ember::bf16::join / split): the float32 whose bit pattern is top << 16 | bottom, and back.
  static Reg join(const uint16_t* top, const uint16_t* bottom) {
    const uint32_t bits = static_cast<uint32_t>(*top) << 16 | *bottom;
    float x;
    __builtin_memcpy(&x, &bits, sizeof x);
    return x;
  }
  static void split(uint16_t* top, uint16_t* bottom, Reg v) {
    uint32_t bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    *top = static_cast<uint16_t>(bits >> 16);
    *bottom = static_cast<uint16_t>(bits);
  }
  static Reg set1(float x) { return x; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg div(Reg a, Reg b) { return a / b; }
  static Reg reciprocal(Reg a) { return 1.0f / a; }
  static Reg neg(Reg a) { return -a; }
  static Reg sqrt(Reg a) { return __builtin_sqrtf(a); }
  // torch.maximum: NaN if either operand is NaN.
  static Reg max(Reg a, Reg b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
  // max(x, floor) and min(x, ceiling) for a bound that is not NaN; a NaN x stays NaN.
  static Reg clamp_below(Reg x, Reg floor) { return x < floor ? floor : x; }
  static Reg clamp_above(Reg x, Reg ceiling) { return x > ceiling ? ceiling : x; }
  // a·b + c. Rounded twice here: the reference path runs on CPUs without FMA, where fmaf is a library call.
  static Reg fmadd(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg abs(Reg a) { return __builtin_fabsf(a); }
  // |magnitude| with the sign bit of `sign`.
  static Reg with_sign_of(Reg magnitude, Reg sign) { return __builtin_copysignf(magnitude, sign); }
  // To the nearest integer, ties to even (in the default rounding mode), for |a| < 2^22: adding 1.5·2^23 leaves
  // no fraction bits, so the sum is rounded to an integer, and subtracting gives it back exactly. (No library
  // call: nearbyintf is one where SSE4.1 is not assumed.)
  static Reg round(Reg a) { return (a + 12582912.0f) - 12582912.0f; }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static Reg pow2(Reg n) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float x;
    __builtin_memcpy(&x, &bits, sizeof x);
    return x;
  }
  using Mask = bool;
  static Mask lt(Reg a, Reg b) { return a < b; }
  static Mask gt(Reg a, Reg b) { return a > b; }
  static Mask is_nan(Reg a) { return a != a; }
  static Reg select(Mask m, Reg if_true, Reg if_false) { return m ? if_true : if_false; }
  static float hsum(Reg a) { return a; }
};

// One double: the float64 path of the families that take float64 tensors (gradient checks and float64 references
// run through the kernels, not around them). Only what their bodies use; every machine runs it.
struct ScalarD {
  using Reg = double;
  static constexpr int kWidth = 1;
  static Reg load(const double* p) { return *p; }
  static void store(double* p, Reg v) { *p = v; }
  static Reg set1(double x) { return x; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg div(Reg a, Reg b) { return a / b; }
  static Reg sqrt(Reg a) { return __builtin_sqrt(a); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return a * b + c; }
  static double hsum(Reg a) { return a; }
};

// The one-element type of V's precision, and its number type: what a body's column tails and scalar sums use
// (ScalarF and float for every float vector, ScalarD and double for ScalarD).
template <typename V>
struct LaneOf {
  using type = ScalarF;
};
template <>
struct LaneOf<ScalarD> {
  using type = ScalarD;
};
template <typename V>
using Lane = typename LaneOf<V>::type;
template <typename V>
using Real = typename Lane<V>::Reg;
