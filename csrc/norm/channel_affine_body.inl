// The per-channel affine map, written once for the file's vector type V (`using V = ...` before inclusion, inside
// the anonymous namespace of each channel_affine_<isa>.cpp, after the vector types).

// Row-major x: row r is channel r % C of sample r / C, `inner` contiguous elements sharing one scale and shift.
template <typename X, typename Y>
void channel_rows(const kernels::AffineArgs<X, Y>& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t c = r % a.channels;
    const float scale = a.scale[c], shift = a.shift != nullptr ? a.shift[c] : 0.0f;
    const auto scale_v = V::set1(scale), shift_v = V::set1(shift);
    const X* x = a.x + r * a.inner;
    Y* y = a.y + r * a.inner;
    int64_t i = 0;
    for (; i + V::kWidth <= a.inner; i += V::kWidth) V::store(y + i, V::fmadd(V::load(x + i), scale_v, shift_v));
    for (; i < a.inner; ++i) ScalarF::store(y + i, ScalarF::fmadd(ScalarF::load(x + i), scale, shift));
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
      V::store(y + c, V::fmadd(V::load(x + c), V::load(a.scale + c), shift));
    }
    for (; c < a.channels; ++c) {
      const float shift = a.shift != nullptr ? a.shift[c] : 0.0f;
      ScalarF::store(y + c, ScalarF::fmadd(ScalarF::load(x + c), a.scale[c], shift));
    }
  }
}
