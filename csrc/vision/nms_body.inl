// The IoU test of nms, written once for the file's vector type V (`using V = ...` before inclusion, inside the
// anonymous namespace of nms_kernels.cpp, once per ISA). max and min are std::max and std::min as torchvision's kernel
// calls them ((a < b) ? b : a and (b < a) ? b : a), so NaN coordinates compare as they do there.

template <typename R>
inline R max_of(R a, R b) {
  return V::select(V::lt(a, b), b, a);
}
template <typename R>
inline R min_of(R a, R b) {
  return V::select(V::lt(b, a), b, a);
}

inline void suppress_range(const kernels::SortedBoxes& b, int64_t i, int64_t begin, int64_t end, float threshold) {
  const auto ix1 = V::set1(b.x1[i]), iy1 = V::set1(b.y1[i]), ix2 = V::set1(b.x2[i]), iy2 = V::set1(b.y2[i]);
  const auto iarea = V::set1(b.area[i]), zero = V::set1(0.0f), one = V::set1(1.0f), thr = V::set1(threshold);
  int64_t j = begin;
  for (; j + V::kWidth <= end; j += V::kWidth) {
    const auto w = max_of(zero, V::sub(min_of(ix2, V::load(b.x2 + j)), max_of(ix1, V::load(b.x1 + j))));
    const auto h = max_of(zero, V::sub(min_of(iy2, V::load(b.y2 + j)), max_of(iy1, V::load(b.y1 + j))));
    const auto inter = V::mul(w, h);
    const auto iou = V::div(inter, V::sub(V::add(iarea, V::load(b.area + j)), inter));
    V::store(b.suppressed + j, max_of(V::load(b.suppressed + j), V::select(V::gt(iou, thr), one, zero)));
  }
  for (; j < end; ++j) {
    const float xx1 = std::max(b.x1[i], b.x1[j]), yy1 = std::max(b.y1[i], b.y1[j]);
    const float xx2 = std::min(b.x2[i], b.x2[j]), yy2 = std::min(b.y2[i], b.y2[j]);
    const float w = std::max(0.0f, xx2 - xx1), h = std::max(0.0f, yy2 - yy1);
    const float inter = w * h;
    if (inter / (b.area[i] + b.area[j] - inter) > threshold) b.suppressed[j] = 1.0f;
  }
}
