// One float as a "vector" of width 1: the reference path, and the tail loop of the wide paths. Included inside an
// anonymous namespace of each kernel compilation (simd/kernel_simd.inl), so every ISA gets its own copy.
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
  static void store(uint16_t* p, Reg v) {
    uint32_t bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7FFFFFFFU) > 0x7F800000U) {
      *p = static_cast<uint16_t>((bits >> 16) | 0x0040U);
    } else {
      *p = static_cast<uint16_t>((bits + 0x7FFFU + ((bits >> 16) & 1U)) >> 16);
    }
  }
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
  static Reg neg(Reg a) { return -a; }
  static Reg sqrt(Reg a) { return __builtin_sqrtf(a); }
  // torch.maximum: NaN if either operand is NaN.
  static Reg max(Reg a, Reg b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
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
