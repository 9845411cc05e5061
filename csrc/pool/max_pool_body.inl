// Max pooling (ember/pool.h), written once for the file's float vector type V (`using V = ...` before inclusion,
// inside a namespace of max_pool_kernels.cpp, once per ISA, after the vector types). Storage is float or uint16_t
// (bfloat16 bits); values are compared as floats. V::max is torch.maximum (NaN if either is), so a NaN anywhere in
// a window reaches the output, as in torch's kernels.
using L = Lane<V>;

// Channel vectors pooled together: independent max chains, so each window tap's loads overlap.
constexpr int kBlock = 4;

// The taps i in [first, end) of a window starting at `start` whose positions start + i·dilation lie in [0, size).
struct Taps {
  int64_t first = 0, end = 0;
};

inline Taps taps(int64_t start, int64_t kernel, int64_t dilation, int64_t size) {
  Taps t;
  t.first = start < 0 ? (-start + dilation - 1) / dilation : 0;
  t.end = start >= size ? 0 : (size - 1 - start) / dilation + 1;
  if (t.end > kernel) t.end = kernel;
  if (t.end < t.first) t.end = t.first;
  return t;
}

// A bf16 result is one of the bf16 inputs, zero or a NaN widened from one: its high half is the value.
template <typename R>
void put(float* p, typename R::Reg v) {
  R::store(p, v);
}
template <typename R>
void put(uint16_t* p, typename R::Reg v) {
  R::store_top(p, v);
}

// Channels [c, c + kCount·R::kWidth) of one output pixel. `window` is the window's first tap inside the input
// (nullptr when none is: the result is then -inf, torch's start value); rows × cols taps.
template <typename R, int kCount, typename T>
void pool_channels(const MaxPoolArgs& a, const T* window, int64_t rows, int64_t cols, int64_t c, T* y) {
  typename R::Reg acc[kCount];
  for (int k = 0; k < kCount; ++k) acc[k] = R::set1(-std::numeric_limits<float>::infinity());
  const int64_t row_step = a.x_sh * a.dilation_h, col_step = a.x_sw * a.dilation_w;
  for (int64_t i = 0; i < rows; ++i) {
    const T* p = window + i * row_step + c;
    for (int64_t j = 0; j < cols; ++j, p += col_step) {
      for (int k = 0; k < kCount; ++k) acc[k] = R::max(acc[k], R::load(p + k * R::kWidth));
    }
  }
  if (a.relu) {
    for (int k = 0; k < kCount; ++k) acc[k] = R::max(acc[k], R::set1(0.0f));
  }
  for (int k = 0; k < kCount; ++k) put<R>(y + c + k * R::kWidth, acc[k]);
}

template <typename T>
void pool_pixel(const MaxPoolArgs& a, const T* window, int64_t rows, int64_t cols, T* y) {
  constexpr int64_t kBlockWidth = int64_t{kBlock} * V::kWidth;
  int64_t c = 0;
  for (; c + kBlockWidth <= a.channels; c += kBlockWidth) {
    pool_channels<V, kBlock>(a, window, rows, cols, c, y);
  }
  for (; c + V::kWidth <= a.channels; c += V::kWidth) pool_channels<V, 1>(a, window, rows, cols, c, y);
  for (; c < a.channels; ++c) pool_channels<L, 1>(a, window, rows, cols, c, y);
}

template <typename T>
void pool_rows(const MaxPoolArgs& a, int64_t begin, int64_t end) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t n = r / a.out_height, oh = r % a.out_height;
    const int64_t h0 = oh * a.stride_h - a.pad_h;
    const Taps th = taps(h0, a.kernel_h, a.dilation_h, a.height);
    T* y = out + n * a.out_sn + oh * a.out_sh;
    for (int64_t ow = 0; ow < a.out_width; ++ow, y += a.out_sw) {
      const int64_t w0 = ow * a.stride_w - a.pad_w;
      const Taps tw = taps(w0, a.kernel_w, a.dilation_w, a.width);
      const int64_t rows = th.end - th.first, cols = tw.end - tw.first;
      const T* window = rows > 0 && cols > 0 ? x + n * a.x_sn + (h0 + th.first * a.dilation_h) * a.x_sh +
                                                   (w0 + tw.first * a.dilation_w) * a.x_sw
                                             : nullptr;
      pool_pixel(a, window, rows, cols, y);
    }
  }
}

void max_pool2d(const MaxPoolArgs& a, int64_t begin, int64_t end) {
  a.bf16 ? pool_rows<uint16_t>(a, begin, end) : pool_rows<float>(a, begin, end);
}
