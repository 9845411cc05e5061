// roi_align's per-channel work, written once for the file's vector type V (`using V = ...` before inclusion, inside
// a namespace of roi_align_kernels.cpp, once per ISA and once for double, after the vector types and
// simd_strips.inl). R is V's number type (float, or double for ScalarD), L the one-element type of its precision.
using R = Real<V>;
using L = Lane<V>;
// A vector's lanes spilled to the stack are declared at the widest vector's alignment. GCC 13 otherwise raises the
// array's alignment itself (to load it with vmovaps) after AddressSanitizer has laid out the frame at 32 bytes: the
// aligned load of a misaligned array faulted on the Xeon under ASan (EveryPathMatchesTheReferencePath).
constexpr size_t kLaneArrayAlign = 64;

// One bin, NV vectors of channels from c: the weighted taps summed in R, divided by the sample count.
template <int NV, typename W>
inline void pool_bin(const kernels::RoiTaps<R>& t, const kernels::PoolArgs<W>& a, int64_t bin, int64_t c) {
  typename V::Reg acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = V::set1(0.0f);
  const int64_t first = bin * t.taps_per_bin;
  for (int64_t k = first; k < first + t.taps_per_bin; ++k) {
    if (t.weight[k] == 0) continue;  // a sample outside the image, or an edge tap
    const W* row = a.image + t.position[k] * a.channels + c;
    const auto w = V::set1(t.weight[k]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = V::fmadd(w, V::load(row + v * V::kWidth), acc[v]);
  }
  const auto count = V::set1(t.count);
  W* out = a.out + bin * a.out_bin_stride + c * a.out_channel_stride;
  if (a.out_channel_stride == 1) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::store(out + v * V::kWidth, V::div(acc[v], count));
  } else {  // a row-major output: each channel of the bin lies out_channel_stride apart
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      alignas(kLaneArrayAlign) R lanes[V::kWidth];
      V::store(lanes, V::div(acc[v], count));
      for (int l = 0; l < V::kWidth; ++l) L::store(out + (v * V::kWidth + l) * a.out_channel_stride, lanes[l]);
    }
  }
}

template <typename W>
void pool_roi(const kernels::RoiTaps<R>& t, const kernels::PoolArgs<W>& a) {
  for (int64_t bin = 0; bin < t.bins; ++bin) {
    const int64_t tail =
        for_each_strip<V>(a.channels, [&](auto nv, int64_t c) { pool_bin<decltype(nv)::value>(t, a, bin, c); });
    for (int64_t c = tail; c < a.channels; ++c) {
      R acc = 0;
      for (int64_t k = bin * t.taps_per_bin; k < (bin + 1) * t.taps_per_bin; ++k) {
        if (t.weight[k] != 0) acc = L::fmadd(t.weight[k], L::load(a.image + t.position[k] * a.channels + c), acc);
      }
      L::store(a.out + bin * a.out_bin_stride + c * a.out_channel_stride, acc / t.count);
    }
  }
}

// Backward, channels [c_begin, c_end) of one box: each tap's share of its bin's gradient added to the tap's position.
template <typename W>
void scatter_roi(const kernels::RoiTaps<R>& t, const kernels::ScatterArgs<W>& a, int64_t c_begin, int64_t c_end) {
  const R inv_count = R{1} / t.count;
  alignas(kLaneArrayAlign) R g[V::kWidth];
  for (int64_t bin = 0; bin < t.bins; ++bin) {
    const W* grad_bin = a.grad_out + bin * a.grad_bin_stride;
    int64_t c = c_begin;
    for (; c + V::kWidth <= c_end; c += V::kWidth) {
      typename V::Reg gv;
      if (a.grad_channel_stride == 1) {
        gv = V::load(grad_bin + c);
      } else {
        for (int l = 0; l < V::kWidth; ++l) g[l] = L::load(grad_bin + (c + l) * a.grad_channel_stride);
        gv = V::load(g);
      }
      gv = V::mul(gv, V::set1(inv_count));
      for (int64_t k = bin * t.taps_per_bin; k < (bin + 1) * t.taps_per_bin; ++k) {
        if (t.weight[k] == 0) continue;
        R* dst = a.grad + t.position[k] * a.channels + c;
        V::store(dst, V::fmadd(V::set1(t.weight[k]), gv, V::load(dst)));
      }
    }
    for (; c < c_end; ++c) {
      const R gc = L::load(grad_bin + c * a.grad_channel_stride) * inv_count;
      for (int64_t k = bin * t.taps_per_bin; k < (bin + 1) * t.taps_per_bin; ++k) {
        if (t.weight[k] != 0) a.grad[t.position[k] * a.channels + c] += t.weight[k] * gc;
      }
    }
  }
}
