// The rotate-half rotary embedding (ember/rope.h), written once for the file's float vector type V (`using V = ...`
// before inclusion, inside a namespace of rope_kernels.cpp, once per ISA, after the vector types). Storage types
// are float or uint16_t (bfloat16 bits); arithmetic is float.
using L = Lane<V>;

template <typename X, typename C, typename Y>
void rotate_row(const X* x, const C* c, const C* s, Y* y, int64_t half) {
  int64_t i = 0;
  for (; i + V::kWidth <= half; i += V::kWidth) {
    const auto lo = V::load(x + i), hi = V::load(x + half + i);
    V::store(y + i, V::sub(V::mul(lo, V::load(c + i)), V::mul(hi, V::load(s + i))));
    V::store(y + half + i, V::fmadd(lo, V::load(s + half + i), V::mul(hi, V::load(c + half + i))));
  }
  for (; i < half; ++i) {
    const float lo = L::load(x + i), hi = L::load(x + half + i);
    L::store(y + i, lo * L::load(c + i) - hi * L::load(s + i));
    L::store(y + half + i, L::fmadd(lo, L::load(s + half + i), hi * L::load(c + half + i)));
  }
}

template <typename T, typename P>
const T* row_of(const Rows4<P>& r, int64_t b, int64_t h, int64_t l) {
  return static_cast<const T*>(r.data) + b * r.sb + h * r.sh + l * r.sl;
}

// y[i] = x[i] for the features past the rotated ones (partial rotary), converted to y's dtype.
template <typename X, typename Y>
void copy_tail(const X* x, Y* y, int64_t from, int64_t to) {
  int64_t i = from;
  for (; i + V::kWidth <= to; i += V::kWidth) V::store(y + i, V::load(x + i));
  for (; i < to; ++i) L::store(y + i, L::load(x + i));
}

template <typename X, typename C, typename Y>
void rows(const RopeArgs& a, int64_t begin, int64_t end) {
  const int64_t half = a.rotary / 2;
  for (int64_t row = begin; row < end; ++row) {
    int64_t b, h, l;
    if (a.heads_inner) {
      h = row % a.heads;
      l = (row / a.heads) % a.length;
      b = row / a.heads / a.length;
    } else {
      l = row % a.length;
      h = (row / a.length) % a.heads;
      b = row / a.length / a.heads;
    }
    Y* y = static_cast<Y*>(a.out.data) + b * a.out.sb + h * a.out.sh + l * a.out.sl;
    const X* x = row_of<X>(a.x, b, h, l);
    rotate_row(x, row_of<C>(a.cos, b, h, l), row_of<C>(a.sin, b, h, l), y, half);
    if (a.rotary < a.dim) copy_tail(x, y, a.rotary, a.dim);
  }
}

template <typename X, typename C>
void with_out(const RopeArgs& a, int64_t begin, int64_t end) {
  a.out.bf16 ? rows<X, C, uint16_t>(a, begin, end) : rows<X, C, float>(a, begin, end);
}

template <typename X>
void with_tables(const RopeArgs& a, int64_t begin, int64_t end) {
  a.cos.bf16 ? with_out<X, uint16_t>(a, begin, end) : with_out<X, float>(a, begin, end);
}

void rotate_half(const RopeArgs& a, int64_t begin, int64_t end) {
  a.x.bf16 ? with_tables<uint16_t>(a, begin, end) : with_tables<float>(a, begin, end);
}
