// One float as a "vector" of width 1: the reference path, and the tail loop of the wide paths. Included inside an
// anonymous namespace of each kernel file (see optim_kernels.h), so every ISA gets its own copy.
struct ScalarF {
  using Reg = float;
  static constexpr int kWidth = 1;
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg v) { *p = v; }
  static Reg set1(float x) { return x; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg div(Reg a, Reg b) { return a / b; }
  static Reg neg(Reg a) { return -a; }
  static Reg sqrt(Reg a) { return __builtin_sqrtf(a); }
  // torch.maximum: NaN if either operand is NaN.
  static Reg max(Reg a, Reg b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
  static float hsum(Reg a) { return a; }
};
