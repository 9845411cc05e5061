// nms: argument checks, the score order, and the greedy pass (ember/vision.h). The float32 IoU test against the
// later boxes is vectorized (nms_body.inl); float64 boxes take the same steps one box at a time.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ember/errors.h"
#include "ember/vision.h"
#include "nms_kernels.h"

namespace ember::vision {
namespace {

using namespace kernels;

constexpr std::string_view kOp = "nms";
constexpr IsaImpl<SuppressFn> kSuppress[] = {
    {Isa::avx512, suppress_avx512}, {Isa::avx2, suppress_avx2}, {Isa::ref, suppress_ref}};

// Indices in decreasing score, equal scores by index, NaN scores after every number.
template <typename T>
std::vector<int64_t> score_order(const T* scores, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [scores](int64_t a, int64_t b) {
    const T sa = scores[a], sb = scores[b];
    if (std::isnan(sb)) return !std::isnan(sa);
    return sa > sb;
  });
  return order;
}

std::vector<int64_t> nms_float(const float* boxes, const float* scores, int64_t n, float threshold) {
  const std::vector<int64_t> order = score_order(scores, n);
  std::vector<float> x1(n), y1(n), x2(n), y2(n), area(n), suppressed(n, 0.0f);
  for (int64_t k = 0; k < n; ++k) {
    const float* box = boxes + 4 * order[k];
    x1[k] = box[0];
    y1[k] = box[1];
    x2[k] = box[2];
    y2[k] = box[3];
    area[k] = (x2[k] - x1[k]) * (y2[k] - y1[k]);
  }
  const SortedBoxes b{x1.data(), y1.data(), x2.data(), y2.data(), area.data(), suppressed.data()};
  const auto& impl = select_impl(kSuppress, active_isa());
  std::vector<int64_t> keep;
  for (int64_t k = 0; k < n; ++k) {
    if (suppressed[k] != 0.0f) continue;
    keep.push_back(order[k]);
    impl.fn(b, k, k + 1, n, threshold);
  }
  return keep;
}

std::vector<int64_t> nms_double(const double* boxes, const double* scores, int64_t n, double threshold) {
  const std::vector<int64_t> order = score_order(scores, n);
  std::vector<char> suppressed(static_cast<size_t>(n), 0);
  std::vector<int64_t> keep;
  auto area = [boxes](int64_t i) { return (boxes[4 * i + 2] - boxes[4 * i]) * (boxes[4 * i + 3] - boxes[4 * i + 1]); };
  for (int64_t k = 0; k < n; ++k) {
    if (suppressed[k]) continue;
    const int64_t i = order[k];
    keep.push_back(i);
    const double* bi = boxes + 4 * i;
    const double iarea = area(i);
    for (int64_t m = k + 1; m < n; ++m) {
      if (suppressed[m]) continue;
      const int64_t j = order[m];
      const double* bj = boxes + 4 * j;
      const double w = std::max(0.0, std::min(bi[2], bj[2]) - std::max(bi[0], bj[0]));
      const double h = std::max(0.0, std::min(bi[3], bj[3]) - std::max(bi[1], bj[1]));
      const double inter = w * h;
      if (inter / (iarea + area(j) - inter) > threshold) suppressed[m] = 1;
    }
  }
  return keep;
}

// torchvision compares a float IoU with the double threshold. The float t with (x > t) == (x > threshold) for every
// float x: float(threshold), or the float below it when float(threshold) rounded up.
float float_threshold(double threshold) {
  const auto t = static_cast<float>(threshold);
  return static_cast<double>(t) > threshold ? std::nextafter(t, -INFINITY) : t;
}

}  // namespace

Isa nms_implementation() { return select_impl(kSuppress, active_isa()).isa; }

std::vector<int64_t> nms(const TensorView& boxes, const TensorView& scores, double iou_threshold) {
  EMBER_CHECK(boxes.dtype() == DType::f32 || boxes.dtype() == DType::f64, TypeError, kOp,
              ": boxes must have dtype float32 or float64, got ", dtype_name(boxes.dtype()));
  EMBER_CHECK(boxes.ndim() == 2 && boxes.size(1) == 4, ValueError, kOp, ": boxes must be [N, 4], got ",
              boxes.describe());
  check::contiguous(kOp, "boxes", boxes);
  check::dtype(kOp, "scores", scores, boxes.dtype());
  EMBER_CHECK(scores.ndim() == 1 && scores.size(0) == boxes.size(0), ValueError, kOp, ": scores must be [",
              boxes.size(0), "] (one a box), got ", scores.describe());
  check::contiguous(kOp, "scores", scores);
  const int64_t n = boxes.size(0);
  if (boxes.dtype() == DType::f32) {
    return nms_float(boxes.data_as<const float>(), scores.data_as<const float>(), n, float_threshold(iou_threshold));
  }
  return nms_double(boxes.data_as<const double>(), scores.data_as<const double>(), n, iou_threshold);
}

}  // namespace ember::vision
