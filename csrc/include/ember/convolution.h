// A convolution (1-D, 2-D or 3-D, grouped, strided, dilated, zero-padded) or a transposed convolution on oneDNN:
// y = epilogue(conv(x, W) + b), with W reordered once into the blocked layout the primitive asks for and kept,
// and one primitive per input shape, memory layout and epilogue, cached.
//
// The weight is the caller's, in torch's layout: [out_channels, in_channels / groups, k...] for a convolution,
// [in_channels, out_channels / groups, k...] for a transposed one. ember keeps only the reordered copy (the
// caller's weight is not needed after construction) and the bias in fp32. Activations are plain strided tensors
// [N, C, spatial...]: channels-first, channels-last (NHWC strides) or any other strides; channels-last is what
// oneDNN's fast implementations read and write directly.
//
// Padding other than zeros (torch's reflect, replicate, circular) is the caller's to apply first.
//
// Thread safety: forward() may run on several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember {

class Convolution {
 public:
  /// Per spatial dimension (1, 2 or 3 of them, the same number in each vector).
  struct Geometry {
    std::vector<int64_t> stride;     // >= 1
    std::vector<int64_t> padding_l;  // zeros before each spatial dimension, >= 0
    std::vector<int64_t> padding_r;  // zeros after; for a transposed convolution, torch's padding - output_padding
    std::vector<int64_t> dilation;   // torch's convention: 1 is a dense kernel
    int64_t groups = 1;
    bool transposed = false;
  };

  struct Options {
    DType compute = DType::f32;  // f32 or bf16: the dtype of x and of the kept weight
  };

  /// A layer with `weight` (f32 or bf16, any strides; torch's layout above) and `bias` [out_channels] (f32 or
  /// bf16) or nullptr. The weight is reordered for inputs shaped like `input_hint` ([N, C, spatial...], its
  /// strides giving the memory layout; its data is never read), which should be the first input the layer sees.
  /// Throws ValueError / TypeError naming the argument, RuntimeError where oneDNN cannot run it.
  Convolution(const TensorView& weight, const TensorView* bias, Geometry geometry, Options options,
              const TensorView& input_hint);
  ~Convolution();
  Convolution(const Convolution&) = delete;
  Convolution& operator=(const Convolution&) = delete;

  /// True when oneDNN can run convolutions in `compute` on this CPU (bf16 needs AVX-512).
  static bool supported(DType compute);

  /// The output shape for an input of shape `input` ([N, C, spatial...]). Throws ValueError when the input does
  /// not fit the layer or leaves no output.
  std::vector<int64_t> output_shape(const std::vector<int64_t>& input) const;

  /// out = epilogue(conv(x) + bias). x: [N, in_channels, spatial...] in the compute dtype, any strides. out: of
  /// output_shape(x), f32 or (for bf16 compute) bf16, any strides, not overlapping x or residual. residual: of
  /// out's shape, f32 or bf16, given exactly when the epilogue has an add. N may be 0. A residual that is out itself
  /// (the same memory, dtype and strides) where the epilogue starts with its add is added in place (oneDNN's sum
  /// post-op; see onednn::accumulates_in_place).
  void forward(const TensorView& x, const TensorView& out, const Epilogue& epilogue = {},
               const TensorView* residual = nullptr) const;

  int64_t in_channels() const noexcept;
  int64_t out_channels() const noexcept;
  const Geometry& geometry() const noexcept;
  const Options& options() const noexcept;
  /// Bytes of reordered weights held (one copy per layout the cached primitives asked for; usually one).
  size_t packed_bytes() const;
  /// Number of primitives cached (one per input shape, layout, epilogue and thread count seen, up to a bound).
  size_t cached_primitives() const;
  /// oneDNN's name of the implementation that runs an input shaped like `x` (no epilogue, an output of x's
  /// memory layout) with the current thread budget, e.g. "brg_conv_fwd:avx512_core_amx". Creates and caches it.
  std::string implementation(const TensorView& x) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember
