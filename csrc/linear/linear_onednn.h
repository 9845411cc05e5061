// oneDNN's matmul for one Linear layer. torch's weight W is [N, K] row-major, which is the matmul's B = Wᵀ [K, N]
// with strides {1, K}: the reorder into the primitive's layout reads it as that, so no transpose is ever
// materialized. The weight is either packed once (prepack) or read where it lies on every call; primitives are
// cached per call shape, epilogue and thread count, the transposed ones (linear_swapped.h) among them.
// Internal to ember_core: ember::Linear runs the calls its router sends here.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/epilogue.h"
#include "ember/linear.h"
#include "ember/tensor_view.h"
#include "tile_matmul/tile_matmul.h"

namespace ember::linear {

class OnednnMatmul {
 public:
  /// For a layer of `weight` [N, K] and `bias` (N floats, or empty; kept by reference, it must outlive this).
  /// With options.prepack the weight is reordered now, for options.rows_hint rows, and never read again.
  OnednnMatmul(const TensorView& weight, const std::vector<float>& bias, const Linear::Options& options);
  ~OnednnMatmul();
  OnednnMatmul(const OnednnMatmul&) = delete;
  OnednnMatmul& operator=(const OnednnMatmul&) = delete;

  /// out = epilogue(x·weightᵀ + bias [+ residual]) for arguments Linear::forward has checked, plain or, for
  /// `swapped`, transposed (falling back to the plain matmul where oneDNN has only reference code for that).
  /// `weight`: the caller's, or nullptr for a prepacked layer.
  void run(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue,
           const TensorView* residual) const;

  /// oneDNN's name for the implementation that runs a call of these shapes (creating and caching the primitive),
  /// followed by " (swapped)" when it runs transposed.
  std::string implementation(bool swapped, const TensorView& x, const TensorView* weight, const TensorView& out) const;

  /// The packed copy made at construction, where the tile matmul reads its layout (oneDNN packs bf16 weights for
  /// AMX that way): its data and layout; else data is nullptr. Fixed for the layer's life.
  struct TileWeights {
    const uint16_t* data = nullptr;
    tile_matmul::PackedLayout layout;
  };
  const TileWeights& tile_weights() const noexcept;

  size_t packed_bytes() const;
  size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::linear
