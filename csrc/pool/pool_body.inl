// Max and average pooling (ember/pool.h), written once for the file's float vector type V (`using V = ...` before
// inclusion, inside a namespace of pool_kernels.cpp, once per ISA, after the vector types). Storage is float or
// uint16_t (bfloat16 bits); arithmetic is float. V::max is torch.maximum (NaN if either is), so a NaN anywhere in a
// window reaches the output, as in torch's kernels; an average sums the window row by row, tap by tap, in float32
// and divides once, torch's order, so it rounds as torch's does.
using L = Lane<V>;

// Channel vectors pooled together: independent chains, so each window tap's loads overlap.
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

// A max's bf16 result is one of the bf16 inputs, zero or a NaN widened from one: its high half is the value. An
// average's is rounded.
template <typename R>
void put(float* p, typename R::Reg v, bool) {
  R::store(p, v);
}
template <typename R>
void put(uint16_t* p, typename R::Reg v, bool exact) {
  exact ? R::store_top(p, v) : R::store(p, v);
}

// One output pixel's window: its first tap inside the input (nullptr when none is), rows × cols taps, and for an
// average the divisor.
template <typename T>
struct Window {
  const T* first = nullptr;
  int64_t rows = 0, cols = 0;
  float divide = 1.0f;
};

// Channels [c, c + kCount·R::kWidth) of one output pixel. A window with no tap gives torch's start values: -inf for
// a max, 0 / divisor for an average.
template <typename R, int kCount, typename T>
void pool_channels(const PoolArgs& a, const Window<T>& w, int64_t c, T* y) {
  const bool average = a.kind == PoolKind::average;
  typename R::Reg acc[kCount];
  const float start = average ? 0.0f : -std::numeric_limits<float>::infinity();
  for (int k = 0; k < kCount; ++k) acc[k] = R::set1(start);
  const int64_t row_step = a.x_sh * a.dilation_h, col_step = a.x_sw * a.dilation_w;
  for (int64_t i = 0; i < w.rows; ++i) {
    const T* p = w.first + i * row_step + c;
    for (int64_t j = 0; j < w.cols; ++j, p += col_step) {
      if (average) {
        for (int k = 0; k < kCount; ++k) acc[k] = R::add(acc[k], R::load(p + k * R::kWidth));
      } else {
        for (int k = 0; k < kCount; ++k) acc[k] = R::max(acc[k], R::load(p + k * R::kWidth));
      }
    }
  }
  if (average) {
    for (int k = 0; k < kCount; ++k) acc[k] = R::div(acc[k], R::set1(w.divide));
  } else if (a.relu) {
    for (int k = 0; k < kCount; ++k) acc[k] = R::max(acc[k], R::set1(0.0f));
  }
  for (int k = 0; k < kCount; ++k) put<R>(y + c + k * R::kWidth, acc[k], !average);
}

// Windows of this many taps or more (a global pool, a 7x7 window) with more channels than a register block are
// pooled a whole pixel at a time: each tap's channels are read as one contiguous run into float32 sums kept in L1,
// where the register blocks would read kBlock vectors from every tap, a stride of a pixel apart (the global pool
// of an EfficientNet squeeze-excitation, [1, 672, 14, 14] fp32, ran at half torch's speed so). The sums are taken
// in the same order, so the results are the same.
constexpr int64_t kManyTaps = 16;
constexpr int64_t kRowChannels = 2048;  // channels summed at a time: 8 KiB of float32

template <typename T>
void pool_pixel_by_taps(const PoolArgs& a, const Window<T>& w, int64_t c_begin, int64_t c_end, T* y) {
  const bool average = a.kind == PoolKind::average;
  alignas(64) float acc[kRowChannels];
  const int64_t row_step = a.x_sh * a.dilation_h, col_step = a.x_sw * a.dilation_w;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kRowChannels) {
    const int64_t n = std::min(kRowChannels, c_end - c0);
    const auto start = V::set1(average ? 0.0f : -std::numeric_limits<float>::infinity());
    int64_t k = 0;
    for (; k + V::kWidth <= n; k += V::kWidth) V::store(acc + k, start);
    for (; k < n; ++k) acc[k] = average ? 0.0f : -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < w.rows; ++i) {
      const T* p = w.first + i * row_step + c0;
      for (int64_t j = 0; j < w.cols; ++j, p += col_step) {
        k = 0;
        if (average) {
          for (; k + V::kWidth <= n; k += V::kWidth) V::store(acc + k, V::add(V::load(acc + k), V::load(p + k)));
          for (; k < n; ++k) acc[k] = L::add(acc[k], L::load(p + k));
        } else {
          for (; k + V::kWidth <= n; k += V::kWidth) V::store(acc + k, V::max(V::load(acc + k), V::load(p + k)));
          for (; k < n; ++k) acc[k] = L::max(acc[k], L::load(p + k));
        }
      }
    }
    k = 0;
    const auto finish = [&](auto r, auto v) {
      using R = decltype(r);
      if (average) return R::div(v, R::set1(w.divide));
      return a.relu ? R::max(v, R::set1(0.0f)) : v;
    };
    for (; k + V::kWidth <= n; k += V::kWidth) put<V>(y + c0 + k, finish(V{}, V::load(acc + k)), !average);
    for (; k < n; ++k) put<L>(y + c0 + k, finish(L{}, acc[k]), !average);
  }
}

template <typename T>
void pool_pixel(const PoolArgs& a, const Window<T>& w, int64_t c_begin, int64_t c_end, T* y) {
  constexpr int64_t kBlockWidth = int64_t{kBlock} * V::kWidth;
  if (w.rows * w.cols >= kManyTaps && c_end - c_begin > kBlockWidth) {
    pool_pixel_by_taps(a, w, c_begin, c_end, y);
    return;
  }
  int64_t c = c_begin;
  for (; c + kBlockWidth <= c_end; c += kBlockWidth) pool_channels<V, kBlock>(a, w, c, y);
  for (; c + V::kWidth <= c_end; c += V::kWidth) pool_channels<V, 1>(a, w, c, y);
  for (; c < c_end; ++c) pool_channels<L, 1>(a, w, c, y);
}

// torch's divisor of an average window (avg_pool2d's CPU kernels): the window clipped to the padded input, or to
// the input without count_include_pad, or the fixed divisor.
inline float divisor_of(const PoolArgs& a, int64_t h0, int64_t w0, const Taps& th, const Taps& tw) {
  if (a.divisor != 0) return static_cast<float>(a.divisor);
  if (!a.count_include_pad) return static_cast<float>((th.end - th.first) * (tw.end - tw.first));
  const int64_t h_end = std::min(h0 + a.kernel_h, a.height + a.pad_h);
  const int64_t w_end = std::min(w0 + a.kernel_w, a.width + a.pad_w);
  return static_cast<float>((h_end - h0) * (w_end - w0));
}

template <typename T>
void pool_items(const PoolArgs& a, int64_t begin, int64_t end) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t r = item / a.channel_chunks, chunk = item % a.channel_chunks;
    const int64_t c_begin = chunk * a.chunk_channels, c_end = std::min(a.channels, c_begin + a.chunk_channels);
    const int64_t n = r / a.out_height, oh = r % a.out_height;
    const int64_t h0 = oh * a.stride_h - a.pad_h;
    const Taps th = taps(h0, a.kernel_h, a.dilation_h, a.height);
    T* y = out + n * a.out_sn + oh * a.out_sh;
    for (int64_t ow = 0; ow < a.out_width; ++ow, y += a.out_sw) {
      const int64_t w0 = ow * a.stride_w - a.pad_w;
      const Taps tw = taps(w0, a.kernel_w, a.dilation_w, a.width);
      Window<T> w;
      w.rows = th.end - th.first;
      w.cols = tw.end - tw.first;
      if (w.rows > 0 && w.cols > 0) {
        w.first = x + n * a.x_sn + (h0 + th.first * a.dilation_h) * a.x_sh + (w0 + tw.first * a.dilation_w) * a.x_sw;
      }
      if (a.kind == PoolKind::average) w.divide = divisor_of(a, h0, w0, th, tw);
      pool_pixel(a, w, c_begin, c_end, y);
    }
  }
}

void pool2d(const PoolArgs& a, int64_t begin, int64_t end) {
  a.bf16 ? pool_items<uint16_t>(a, begin, end) : pool_items<float>(a, begin, end);
}
