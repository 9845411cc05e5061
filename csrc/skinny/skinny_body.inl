// The skinny matmul's body, instantiated by skinny_kernels.cpp (once per ISA) with the ISA's `Dot` policy. Included
// inside an anonymous namespace after the policy's definition.
//
// A Dot policy gives: `Vec` (kStep inputs, in whatever form its multiply takes), `Acc` (a vector of fp32 partial
// sums), `kStep` (k elements per multiply-add), `kRegisters` (vector registers of the ISA; 0 for scalar code), and
//   static Acc zero();  static Vec load(const S* p);  static Acc madd(Acc acc, Vec w, Vec x);
//   static float sum(Acc acc);  // lanes added in a fixed order
//
// For each block of rows of w, the m rows of x are loaded once per k step and each loaded piece of w is used m
// times, so w (the big operand) streams through once; k's tail, shorter than a step, is added in scalar fp32.

inline float to_float(float v) { return v; }
inline float to_float(uint16_t bits) { return bf16::widen(bits); }

template <typename Dot, typename S, int M, int R>
void dot_block(const S* x, int64_t ldx, const S* w, int64_t ldw, int64_t k, float* y, int64_t ldy) {
  typename Dot::Acc acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) acc[r][i] = Dot::zero();
  }
  int64_t kk = 0;
  for (; kk + Dot::kStep <= k; kk += Dot::kStep) {
    typename Dot::Vec xv[M];
    for (int i = 0; i < M; ++i) xv[i] = Dot::load(x + i * ldx + kk);
    for (int r = 0; r < R; ++r) {
      const typename Dot::Vec wv = Dot::load(w + r * ldw + kk);
      for (int i = 0; i < M; ++i) acc[r][i] = Dot::madd(acc[r][i], wv, xv[i]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) {
      float tail = 0.0f;
      for (int64_t t = kk; t < k; ++t) tail += to_float(w[r * ldw + t]) * to_float(x[i * ldx + t]);
      y[i * ldy + r] = Dot::sum(acc[r][i]) + tail;
    }
  }
}

// Rows of w in flight for m rows of x: as many as keep R·m accumulators, the m inputs and one weight vector in
// registers (at least 1, at most 4: beyond that the weight streams gain nothing).
template <typename Dot, int M>
constexpr int rows_in_flight() {
  if (Dot::kRegisters == 0) return 4;
  const int fit = (Dot::kRegisters - M - 1) / M;
  return fit < 1 ? 1 : (fit > 4 ? 4 : fit);
}

template <typename Dot, typename S, int M>
void dot_rows_m(const S* x, int64_t ldx, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1, float* y,
                int64_t ldy) {
  constexpr int R = rows_in_flight<Dot, M>();
  int64_t n = n0;
  for (; n + R <= n1; n += R) dot_block<Dot, S, M, R>(x, ldx, w + n * ldw, ldw, k, y + (n - n0), ldy);
  for (; n < n1; ++n) dot_block<Dot, S, M, 1>(x, ldx, w + n * ldw, ldw, k, y + (n - n0), ldy);
}

// Any m: in groups of the kMaxRows rows the bodies are unrolled for (more than kMaxRows reach here only as bf16
// rows on an AMX machine, too short for a tile step, or as the AMX path's last rows of w).
template <typename Dot, typename S>
void dot_rows_any(const S* x, int64_t ldx, int64_t m, const S* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                  float* y, int64_t ldy) {
  static_assert(kMaxRows == 8, "one instantiation per row count up to kMaxRows");
  for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
    const S* xi = x + i0 * ldx;
    float* yi = y + i0 * ldy;
    switch (m - i0) {
      case 1: dot_rows_m<Dot, S, 1>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 2: dot_rows_m<Dot, S, 2>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 3: dot_rows_m<Dot, S, 3>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 4: dot_rows_m<Dot, S, 4>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 5: dot_rows_m<Dot, S, 5>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 6: dot_rows_m<Dot, S, 6>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      case 7: dot_rows_m<Dot, S, 7>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
      default: dot_rows_m<Dot, S, 8>(xi, ldx, w, ldw, k, n0, n1, yi, ldy); break;
    }
  }
}
