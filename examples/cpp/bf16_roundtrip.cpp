// A C++ program using the ember core without Python or torch: split fp32 weights into their bf16 top halves and
// 16-bit bottom halves, round a copy to bf16, and show that joining the halves restores every bit.
//
//   cmake -S examples/cpp -B build/example -DCMAKE_PREFIX_PATH=<where ember, oneDNN and oneTBB are installed>
//   cmake --build build/example && build/example/bf16_roundtrip
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <ember/ember.h>

int main() {
  const int64_t n = 1 << 20;
  std::vector<float> weights(n);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& w : weights) w = normal(rng);

  std::vector<uint16_t> top(n), bottom(n), rounded(n);
  std::vector<float> joined(n);
  ember::TensorView w(weights.data(), ember::DType::f32, {n});
  ember::bf16::split(w, ember::TensorView(top.data(), ember::DType::bf16, {n}),
                     ember::TensorView(bottom.data(), ember::DType::i16, {n}));
  ember::bf16::join(ember::TensorView(top.data(), ember::DType::bf16, {n}),
                    ember::TensorView(bottom.data(), ember::DType::i16, {n}),
                    ember::TensorView(joined.data(), ember::DType::f32, {n}));
  ember::bf16::round(w, ember::TensorView(rounded.data(), ember::DType::bf16, {n}));

  const bool exact = std::memcmp(joined.data(), weights.data(), n * sizeof(float)) == 0;
  double err_top = 0, err_round = 0;
  for (int64_t i = 0; i < n; ++i) {
    err_top += std::fabs(ember::bf16::bits_float(uint32_t{top[i]} << 16) - weights[i]);
    err_round += std::fabs(ember::bf16::bits_float(uint32_t{rounded[i]} << 16) - weights[i]);
  }
  std::printf("ember %s, ISA %s (detected %s), %d threads\n", ember::build_info().version.c_str(),
              std::string(ember::isa_name(ember::active_isa())).c_str(),
              std::string(ember::isa_name(ember::detected_isa())).c_str(), ember::num_threads());
  std::printf("join(split(w)) == w bit for bit: %s\n", exact ? "yes" : "NO");
  std::printf("mean |top - w| = %.3g (truncation), mean |round(w) - w| = %.3g (nearest even)\n", err_top / n,
              err_round / n);
  try {
    ember::bf16::round(w, ember::TensorView(rounded.data(), ember::DType::f16, {n}));
  } catch (const ember::TypeError& e) {
    std::printf("a bad argument raises: %s\n", e.what());
  }
  return exact ? 0 : 1;
}
