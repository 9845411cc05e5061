// A Linear layer: y = epilogue(x·Wᵀ + b) on the kernel that serves each call best (csrc/linear/linear_route.h
// holds the rules): ember's skinny matmul for a few rows on the weight where it lies, ember's tile matmul for a
// batch-1 sequence's rows on a packed bf16 copy where AMX runs, oneDNN's matmul (computed transposed for some fp32
// calls) with W read in place or reordered once into the blocked layout the primitive asks for, and one primitive
// per input shape and epilogue, cached. Where the caller's own matmul (torch's) is the
// faster one, route() says so before the call is made.
//
// The weight is the caller's (torch's nn.Linear.weight, [N, K], or a weight folded from it); ember keeps a
// reordered copy as a cache and nothing else, and the caller keeps the weight's logical form, the one its
// state_dict() returns. A caller that changes the weight builds a new Linear (python/ember ties this to the
// tensor's version counter).
//
// Thread safety: forward() may run on several threads at once. Results do not depend on the number of threads
// beyond the order of fp32 additions inside oneDNN's reduction over K (docs/decisions.md, "Inference").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ember/epilogue.h"
#include "ember/tensor_view.h"

namespace ember {

/// The kernels that can serve a Linear call.
enum class LinearKernel : uint8_t {
  caller,    // the caller's own matmul (torch's) is the faster one: the caller runs the call itself
  skinny,    // ember's skinny matmul, a stream down the rows of the weight where it lies (csrc/skinny/)
  tiles,     // ember's tile matmul, AMX tiles on the packed bf16 copy for a batch-1 sequence (csrc/tile_matmul/)
  few_rows,  // ember's few-row matmul, vdpbf16ps on the packed bf16 copy for 1-4 rows (csrc/tile_matmul/)
  swapped,   // oneDNN's fp32 matmul computed transposed, on the weight where it lies (csrc/linear/linear_swapped.h)
  onednn,    // oneDNN's matmul, on the packed copy or on the weight where it lies
};

/// "caller", "skinny", "tiles", "few_rows", "swapped" or "onednn".
const char* kernel_name(LinearKernel kernel) noexcept;

class Linear {
 public:
  struct Options {
    DType compute = DType::f32;  // f32 or bf16: the dtype of x and of the kept weight
    bool prepack = true;         // false: run on the caller's weight as it is laid out (no copy kept)
    int64_t rows_hint = 64;      // the input rows the weight is first packed for
  };

  /// A layer with weight [out_features, in_features] (f32 or bf16, any strides), copied into the layout oneDNN
  /// prefers for `rows_hint` rows, and bias [out_features] (f32 or bf16, copied in fp32) or nullptr. Without
  /// prepacking nothing of the weight is kept and every forward must pass it. Throws ValueError / TypeError
  /// naming the argument.
  Linear(const TensorView& weight, const TensorView* bias, Options options);
  ~Linear();
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  /// True when oneDNN can run a matmul in `compute` on this CPU (its bf16 matmul needs AVX-512). Layers of an
  /// unsupported dtype throw RuntimeError on construction; python/ember leaves them to torch instead.
  static bool supported(DType compute);

  /// A layer that is not prepacked runs inputs of at most this many rows on ember's skinny matmul (a stream down
  /// the weight's rows where it lies, csrc/skinny/) instead of oneDNN's matmul, which reorders slices of an
  /// unpacked weight on every call: 32 for bf16 where AMX runs, 8 otherwise (under the current ISA cap).
  static int64_t skinny_rows(DType compute) noexcept;

  /// The one question a caller asks before sending calls of `rows` rows (a contiguous input, no epilogue) to a
  /// layer of `compute` on `weight` ([N, K] as the caller holds it, any strides; only its shape and strides are
  /// read): which kernel serves them. LinearKernel::caller means the caller's own matmul is the faster one; the
  /// caller then runs the call itself. `in_place`: the layer runs on that weight where it lies (prepack false).
  /// `caller_mkl_fp32`: the caller's fp32 matmul is MKL's on an Intel CPU (torch built with MKL), the only one
  /// its fp32 rules were measured against; false keeps every fp32 call on ember's kernels.
  static LinearKernel route(DType compute, int64_t rows, const TensorView& weight, bool in_place, bool caller_mkl_fp32);

  /// out = epilogue(x·weightᵀ + bias) on the ember kernel that route() names (it runs whatever it is given, also
  /// a call route() would leave to the caller). x: [M, in_features] in the compute dtype, unit stride along K (rows may
  /// have any stride >= K). out: [M, out_features], f32 or (for bf16 compute) bf16, unit stride along N, not
  /// overlapping x, weight or residual. residual: [M, N], f32 or bf16, given exactly when the epilogue has an
  /// add. M may be 0. `weight` (the one the layer was built from) may be nullptr for a prepacked layer: a shape
  /// whose fastest implementation wants another layout then gets a copy reordered from the packed one.
  void forward(const TensorView& x, const TensorView* weight, const TensorView& out, const Epilogue& epilogue = {},
               const TensorView* residual = nullptr) const;

  /// forward() on `kernel` rather than the router's choice, for tests and benchmarks that compare kernels on one
  /// call: LinearKernel::onednn (oneDNN's plain matmul), LinearKernel::tiles (up to 4096 rows; the layer must hold
  /// a packed bf16 copy in the tile matmul's layout, and AMX must run) or LinearKernel::few_rows (up to 4 rows; the
  /// same copy, and AVX512-BF16 must run). Throws ValueError or RuntimeError
  /// where the kernel cannot run the call, before anything is written.
  void forward_on(LinearKernel kernel, const TensorView& x, const TensorView* weight, const TensorView& out,
                  const Epilogue& epilogue = {}, const TensorView* residual = nullptr) const;

  int64_t out_features() const noexcept;
  int64_t in_features() const noexcept;
  const Options& options() const noexcept;
  /// Bytes of reordered weights held (one copy per layout the cached primitives asked for; usually one).
  size_t packed_bytes() const;
  /// Number of primitives cached (one per input shape, epilogue and thread count seen, up to a bound).
  size_t cached_primitives() const;
  /// The name of the implementation that runs a contiguous M-row input (no epilogue) with the current thread
  /// budget: oneDNN's, e.g. "brg:avx512_core_amx" (creating and caching the primitive), "ember:skinny:<isa>" or
  /// "ember:tiles:amx".
  std::string implementation(int64_t m, const TensorView* weight = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember
