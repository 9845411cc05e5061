// Per-ISA bodies of the optimizer steps, each over one piece [begin, end) of one slot. Internal to ember_core:
// adam.cpp, sgd.cpp, adagrad.cpp and lamb.cpp validate, precompute the per-slot coefficients and run these in
// parallel.
//
// The arithmetic lives once, in *_body.inl, written against a small vector interface (csrc/simd/simd_*.inl);
// optim_kernels.cpp includes the bodies inside an anonymous namespace, so that code compiled with wide-vector flags
// stays private to it, and is compiled once per ISA (ember_kernel_family), defining each entry point below for
// that ISA and the three storages.
#pragma once

#include <cstdint>

namespace ember::optim::kernels {

// ---------------------------------------------------------------------------------------------------------------
// Storages: how a slot holds its parameter and gradient. Optimizer state is float32 whatever the storage.

/// float32 parameter and gradient.
struct Fp32Storage {
  using Param = float;
  using Grad = float;
  static constexpr bool kSplit = false;
};
/// bfloat16 parameter and gradient (uint16_t bit patterns): widened exactly on load, rounded to nearest even on
/// store.
struct Bf16Storage {
  using Param = uint16_t;
  using Grad = uint16_t;
  static constexpr bool kSplit = false;
};
/// Split-BF16 parameter: the float32 value whose high 16 bits are `param` (the bf16 tensor the model computes
/// with) and whose low 16 bits are `bottom`; the gradient is bfloat16. Joined on load and split again on store,
/// both exact, so the parameter is updated as the float32 value it is.
struct SplitStorage {
  using Param = uint16_t;
  using Grad = uint16_t;
  static constexpr bool kSplit = true;
};

/// Which storage a slot has (for the entry points that pick a kernel per slot).
enum class StorageKind : uint8_t { fp32, bf16, split };

// ---------------------------------------------------------------------------------------------------------------
// Adam / AdamW

/// Adam's per-slot constants, in float as torch applies them to float tensors.
struct AdamCoeffs {
  float inv_grad_scale_denominator = 1.0f;  // g = g / this (1: no scaler)
  float decay_factor = 1.0f;                // AdamW: p *= 1 - lr * weight_decay
  float weight_decay = 0.0f;                // Adam:  g += weight_decay * p
  bool decays = false;                      // Adam:  weight_decay != 0 (see SgdCoeffs::decays)
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = -1e-3f;  // -lr / (1 - beta1^step)
  bool maximize = false;
  bool decoupled = false;
  bool amsgrad = false;
  bool scaled = false;
};

template <typename S>
struct AdamPointers {
  using Storage = S;
  typename S::Param* param;
  uint16_t* bottom;  // SplitStorage only
  const typename S::Grad* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;  // amsgrad only
};

template <typename S>
using AdamFn = void (*)(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c);

// ---------------------------------------------------------------------------------------------------------------
// SGD (and LARS's update pass)

struct SgdCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  // torch tests weight_decay != 0 in double and then multiplies in float: a decay that rounds to 0 in float still
  // multiplies p (0·inf = NaN), so whether it applies is its own flag.
  bool decays = false;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = -1e-3f;
  float trust = 1.0f;  // LARS: (g + weight_decay * p) is multiplied by this before momentum
  bool maximize = false;
  bool scaled = false;
  bool nesterov = false;
  bool first_step = false;
};

template <typename S>
struct SgdPointers {
  using Storage = S;
  typename S::Param* param;
  uint16_t* bottom;  // SplitStorage only
  const typename S::Grad* grad;
  float* momentum_buffer;  // null when momentum == 0
};

template <typename S>
using SgdFn = void (*)(const SgdPointers<S>& t, int64_t begin, int64_t end, const SgdCoeffs& c);

// ---------------------------------------------------------------------------------------------------------------
// Adagrad

struct AdagradCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  bool decays = false;  // weight_decay != 0 (see SgdCoeffs::decays)
  float eps = 1e-10f;
  float neg_clr = -1e-2f;  // -lr / (1 + (step - 1) * lr_decay)
  bool maximize = false;
  bool scaled = false;
};

template <typename S>
struct AdagradPointers {
  using Storage = S;
  typename S::Param* param;
  uint16_t* bottom;  // SplitStorage only
  const typename S::Grad* grad;
  float* state_sum;
};

template <typename S>
using AdagradFn = void (*)(const AdagradPointers<S>& t, int64_t begin, int64_t end, const AdagradCoeffs& c);

// ---------------------------------------------------------------------------------------------------------------
// Lamb, and the norms LARS needs

struct LambCoeffs {
  float grad_scale = 1.0f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  // 1 / (1 - beta^step), computed once in double: the kernels multiply. A vector division costs about as much as
  // the sqrt (vdivps zmm, one per 5-8 cycles), and the two divisions by a per-tensor constant kept Lamb at 78% of
  // the memory ceiling on the 16-core Xeon where Adam, with one division, ran at 89% (optim-intel-*.md).
  float inv_bias_correction1 = 1.0f;
  float inv_bias_correction2 = 1.0f;
  float eps = 1e-6f;
  float weight_decay = 0.0f;
  bool decays = false;          // weight_decay != 0 (see SgdCoeffs::decays)
  float neg_lr_trust = -1e-3f;  // second pass: -lr * ||p|| / ||u||
  bool maximize = false;
  bool scaled = false;
};

template <typename S>
struct LambPointers {
  using Storage = S;
  typename S::Param* param = nullptr;
  uint16_t* bottom = nullptr;  // SplitStorage only
  const typename S::Grad* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* direction = nullptr;  // u, written by the first pass and read by the second; null: the second recomputes it
};

/// Lamb's first pass over [begin, end): updates m and v, returns the sums of p^2 and u^2 (lanes added in a fixed
/// order, so a block's sums depend only on its data), and keeps u in `direction` when there is one.
template <typename S>
using LambMomentsFn = void (*)(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                               double* u_sq);
/// Lamb's second pass: p += neg_lr_trust * u, u read from `direction` or recomputed from the updated m and v.
template <typename S>
using LambApplyFn = void (*)(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c);

/// A parameter and its gradient, read only: what LARS's norms pass reads.
template <typename S>
struct NormPointers {
  using Storage = S;
  const typename S::Param* param;
  const uint16_t* bottom;  // SplitStorage only
  const typename S::Grad* grad;
};

/// Sums of p^2 and g^2 over [begin, end) (LARS's norms), in the same fixed order.
template <typename S>
using SumSquaresFn = void (*)(const NormPointers<S>& t, int64_t begin, int64_t end, double* p_sq, double* g_sq);

// The entry points, one set per ISA (optim_kernels.cpp, compiled for each).
#define EMBER_OPTIM_DECLARE_KERNELS(isa)                                                                           \
  template <typename S>                                                                                            \
  void adam_##isa(const AdamPointers<S>& t, int64_t begin, int64_t end, const AdamCoeffs& c);                      \
  template <typename S>                                                                                            \
  void sgd_##isa(const SgdPointers<S>& t, int64_t begin, int64_t end, const SgdCoeffs& c);                         \
  template <typename S>                                                                                            \
  void adagrad_##isa(const AdagradPointers<S>& t, int64_t begin, int64_t end, const AdagradCoeffs& c);             \
  template <typename S>                                                                                            \
  void lamb_moments_##isa(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq, \
                          double* u_sq);                                                                           \
  template <typename S>                                                                                            \
  void lamb_apply_##isa(const LambPointers<S>& t, int64_t begin, int64_t end, const LambCoeffs& c);                \
  template <typename S>                                                                                            \
  void sum_squares_##isa(const NormPointers<S>& t, int64_t begin, int64_t end, double* p_sq, double* g_sq);
EMBER_OPTIM_DECLARE_KERNELS(ref)
EMBER_OPTIM_DECLARE_KERNELS(avx2)
EMBER_OPTIM_DECLARE_KERNELS(avx512)
#undef EMBER_OPTIM_DECLARE_KERNELS

}  // namespace ember::optim::kernels

/// Expands X(storage) for the three storages: how optim_kernels.cpp instantiates its kernel templates.
#define EMBER_OPTIM_FOR_EACH_STORAGE(X)   \
  X(::ember::optim::kernels::Fp32Storage) \
  X(::ember::optim::kernels::Bf16Storage) X(::ember::optim::kernels::SplitStorage)
