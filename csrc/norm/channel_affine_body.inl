// The per-channel affine map, written once for the file's vector type V (`using V = ...` before inclusion, inside
// a namespace of norm_kernels.cpp, once per ISA and once for double, after the vector types). R is
// V's number type (float, or double for ScalarD), L the one-element type of its precision.
using R = Real<V>;
using L = Lane<V>;

// ReLU after the affine map where asked (NaN stays NaN: R::max is torch.maximum); float arithmetic only, the
// double path has no activation.
template <typename P>
typename P::Reg rectified(typename P::Reg v, bool relu) {
  if constexpr (std::is_same_v<R, float>) {
    if (relu) return P::max(v, P::set1(0.0f));
  }
  return v;
}

// Row-major x: row r is channel r % C of sample r / C, `inner` contiguous elements sharing one scale and shift.
template <typename X, typename Y>
void channel_rows(const kernels::AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t c = r % a.channels;
    const R scale = a.scale[c], shift = a.shift != nullptr ? a.shift[c] : R{0};
    const auto scale_v = V::set1(scale), shift_v = V::set1(shift);
    const X* x = a.x + r * a.inner;
    Y* y = a.y + r * a.inner;
    int64_t i = 0;
    for (; i + V::kWidth <= a.inner; i += V::kWidth) {
      V::store(y + i, rectified<V>(V::fmadd(V::load(x + i), scale_v, shift_v), a.relu));
    }
    for (; i < a.inner; ++i) L::store(y + i, rectified<L>(L::fmadd(L::load(x + i), scale, shift), a.relu));
  }
}

// Channels-last x: row r is one position's C channels, the scale and shift vectors walked along with them.
template <typename X, typename Y>
void position_rows(const kernels::AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const X* x = a.x + r * a.channels;
    Y* y = a.y + r * a.channels;
    int64_t c = 0;
    for (; c + V::kWidth <= a.channels; c += V::kWidth) {
      const auto shift = a.shift != nullptr ? V::load(a.shift + c) : V::set1(0.0f);
      V::store(y + c, rectified<V>(V::fmadd(V::load(x + c), V::load(a.scale + c), shift), a.relu));
    }
    for (; c < a.channels; ++c) {
      const R shift = a.shift != nullptr ? a.shift[c] : R{0};
      L::store(y + c, rectified<L>(L::fmadd(L::load(x + c), a.scale[c], shift), a.relu));
    }
  }
}
