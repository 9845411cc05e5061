// nms: every ISA path against a scalar transcription of torchvision's CPU kernel (the same float arithmetic, the
// float IoU compared with the double threshold), float64 boxes, edge thresholds and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ember/errors.h"
#include "ember/vision.h"
#include "isa_test_util.h"

namespace ember {
namespace {

// torchvision/csrc/ops/cpu/nms_kernel.cpp, for one scalar type, with a stable descending sort.
template <typename T>
std::vector<int64_t> torchvision_nms(const std::vector<T>& boxes, const std::vector<T>& scores, double threshold) {
  const auto n = static_cast<int64_t>(scores.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  std::vector<char> suppressed(n, 0);
  std::vector<int64_t> keep;
  auto area = [&](int64_t i) { return (boxes[4 * i + 2] - boxes[4 * i]) * (boxes[4 * i + 3] - boxes[4 * i + 1]); };
  for (int64_t a = 0; a < n; ++a) {
    const int64_t i = order[a];
    if (suppressed[i]) continue;
    keep.push_back(i);
    for (int64_t b = a + 1; b < n; ++b) {
      const int64_t j = order[b];
      if (suppressed[j]) continue;
      const T xx1 = std::max(boxes[4 * i], boxes[4 * j]), yy1 = std::max(boxes[4 * i + 1], boxes[4 * j + 1]);
      const T xx2 = std::min(boxes[4 * i + 2], boxes[4 * j + 2]), yy2 = std::min(boxes[4 * i + 3], boxes[4 * j + 3]);
      const T w = std::max(static_cast<T>(0), xx2 - xx1), h = std::max(static_cast<T>(0), yy2 - yy1);
      const T inter = w * h;
      const T ovr = inter / (area(i) + area(j) - inter);
      if (ovr > threshold) suppressed[j] = 1;
    }
  }
  return keep;
}

// Clusters of overlapping boxes (so thresholds matter), distinct scores.
template <typename T>
void random_boxes(int64_t n, uint32_t seed, std::vector<T>& boxes, std::vector<T>& scores) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> centre(0, 200), jitter(-8, 8), size(5, 40), score(0, 1);
  boxes.clear();
  scores.clear();
  for (int64_t k = 0; k < n; ++k) {
    const float cx =
        k % 7 == 0 ? centre(rng) : (boxes.empty() ? 50.0f : static_cast<float>(boxes[4 * (k / 7 * 7)])) + jitter(rng);
    const float cy = centre(rng) * 0.1f + cx * 0.5f, w = size(rng), h = size(rng);
    boxes.insert(boxes.end(), {static_cast<T>(cx), static_cast<T>(cy), static_cast<T>(cx + w), static_cast<T>(cy + h)});
    scores.push_back(static_cast<T>(score(rng)));
  }
}

TEST(Nms, EveryPathKeepsWhatTorchvisionsKernelKeeps) {
  for (Isa isa : testing::supported_isas()) {
    testing::ScopedIsaCap cap(isa);
    for (int64_t n : {0, 1, 2, 17, 300, 1000}) {
      for (double threshold : {0.0, 0.3, 0.5, 0.7, 1.0}) {
        std::vector<float> boxes, scores;
        random_boxes(n, static_cast<uint32_t>(n + 1), boxes, scores);
        const auto got = vision::nms(TensorView(boxes.data(), DType::f32, {n, 4}),
                                     TensorView(scores.data(), DType::f32, {n}), threshold);
        ASSERT_EQ(got, torchvision_nms(boxes, scores, threshold))
            << isa_name(isa) << " n " << n << " thr " << threshold;
      }
    }
  }
}

TEST(Nms, Float64BoxesAndEdgeThresholds) {
  std::vector<double> boxes, scores;
  random_boxes(400, 3, boxes, scores);
  for (double threshold : {0.2, 0.7}) {
    EXPECT_EQ(vision::nms(TensorView(boxes.data(), DType::f64, {400, 4}), TensorView(scores.data(), DType::f64, {400}),
                          threshold),
              torchvision_nms(boxes, scores, threshold));
  }
  // Two identical boxes: IoU exactly 1, suppressed at any threshold below 1 and kept at 1; NaN keeps both.
  std::vector<float> same = {0, 0, 10, 10, 0, 0, 10, 10}, s2 = {0.9f, 0.8f};
  const TensorView b(same.data(), DType::f32, {2, 4}), sc(s2.data(), DType::f32, {2});
  EXPECT_EQ(vision::nms(b, sc, 0.99), (std::vector<int64_t>{0}));
  EXPECT_EQ(vision::nms(b, sc, 1.0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(vision::nms(b, sc, std::nan("")), (std::vector<int64_t>{0, 1}));
}

TEST(Nms, BadArguments) {
  std::vector<float> boxes(12), scores(3);
  std::vector<double> dscores(3);
  EXPECT_THROW(
      vision::nms(TensorView(boxes.data(), DType::f32, {4, 3}), TensorView(scores.data(), DType::f32, {3}), 0.5),
      ValueError);
  EXPECT_THROW(
      vision::nms(TensorView(boxes.data(), DType::f32, {3, 4}), TensorView(scores.data(), DType::f32, {2}), 0.5),
      ValueError);
  EXPECT_THROW(
      vision::nms(TensorView(boxes.data(), DType::f32, {3, 4}), TensorView(dscores.data(), DType::f64, {3}), 0.5),
      TypeError);
}

}  // namespace
}  // namespace ember
