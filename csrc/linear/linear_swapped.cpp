#include "linear/linear_swapped.h"

#include <algorithm>

#include "core/growing_buffer.h"
#include "ember/parallel.h"
#include "onednn/onednn_common.h"

namespace ember::linear::swapped {
namespace {

using dnnl::memory;
using onednn::BoundPrimitive;
using onednn::engine;

// Each chunk of the fill and the transposing pass moves at least this many floats: fewer would cost more in
// fork and join than they save.
constexpr int64_t kGrainElements = 4096;

// The columns of the transposing pass's tiles: one row of a tile reads 16 floats of the buffer, a cache line.
constexpr int64_t kTile = 16;

}  // namespace

bool takes(DType compute, const TensorView& x, const TensorView& weight, const TensorView& out,
           const TensorView* residual) {
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  const bool dtypes = compute == DType::f32 && x.dtype() == DType::f32 && weight.dtype() == DType::f32 &&
                      out.dtype() == DType::f32 && (residual == nullptr || residual->dtype() == DType::f32);
  const bool shape = m >= kMinRows && m <= kMaxRows && n >= 16 && k >= 16 && (k > n || n * k >= kBeyondCaches);
  const bool layout = weight.stride(1) == 1 && weight.stride(0) >= k && x.stride(1) == 1;
  return dtypes && shape && layout;
}

dnnl::matmul::primitive_desc make_pd(const TensorView& x, const TensorView& weight, bool bias) {
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  const memory::desc w_as_a({n, k}, memory::data_type::f32, {weight.stride(0), 1});
  const memory::desc x_as_b({k, m}, memory::data_type::f32, {1, x.stride(0)});
  const memory::desc product({n, m}, memory::data_type::f32, {m, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (bias) ops.append_sum(1.0f);
  attr.set_post_ops(ops);
  return dnnl::matmul::primitive_desc(engine(), w_as_a, x_as_b, product, attr);
}

void run(const BoundPrimitive& prim, const TensorView& x, const TensorView& weight, const std::vector<float>& bias,
         const TensorView& out, const TensorView* residual) {
  const int64_t m = x.size(0), n = weight.size(0);
  thread_local GrowingBuffer buffer;
  // Named here, on the calling thread: inside the loops below a thread_local would be each worker's own.
  float* product = static_cast<float*>(buffer.get(static_cast<size_t>(m * n) * sizeof(float)));

  if (!bias.empty()) {
    const float* b = bias.data();
    parallel_for(n, std::max<int64_t>(1, kGrainElements / m), 1, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) std::fill(product + j * m, product + (j + 1) * m, b[j]);
    });
  }
  prim.execute({{DNNL_ARG_SRC, weight.data()}, {DNNL_ARG_WEIGHTS, x.data()}, {DNNL_ARG_DST, product}});

  float* y = static_cast<float*>(out.data());
  const int64_t ldy = out.stride(0);
  const float* res = residual != nullptr ? static_cast<const float*>(residual->data()) : nullptr;
  const int64_t ldr = residual != nullptr ? residual->stride(0) : 0;
  parallel_for(m, std::max<int64_t>(1, kGrainElements / n), 1, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t j0 = 0; j0 < n; j0 += kTile) {
      const int64_t j1 = std::min(n, j0 + kTile);
      for (int64_t i = begin; i < end; ++i) {
        float* row = y + i * ldy;
        if (res != nullptr) {
          const float* r = res + i * ldr;
          for (int64_t j = j0; j < j1; ++j) row[j] = product[j * m + i] + r[j];
        } else {
          for (int64_t j = j0; j < j1; ++j) row[j] = product[j * m + i];
        }
      }
    }
  });
}

}  // namespace ember::linear::swapped
