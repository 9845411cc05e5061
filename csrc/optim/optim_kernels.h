// Per-ISA bodies of the optimizer steps, each over one piece [begin, end) of one slot. Internal to ember_core:
// adam.cpp / sgd.cpp validate, precompute the per-slot coefficients and run these in parallel.
//
// The arithmetic lives once, in *_body.inl, written against a small vector interface (simd_*.inl); each
// *_<isa>.cpp includes the interface for its ISA and the body inside an anonymous namespace, so the code compiled
// with wide-vector flags stays private to that file.
#pragma once

#include <cstdint>

namespace ember::optim::kernels {

/// Adam's per-slot constants, in float as torch applies them to float tensors.
struct AdamCoeffs {
  float inv_grad_scale_denominator = 1.0f;  // g = g / this (1: no scaler)
  float decay_factor = 1.0f;                // AdamW: p *= 1 - lr * weight_decay
  float weight_decay = 0.0f;                // Adam:  g += weight_decay * p
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

/// P is the storage of the parameter and gradient: float, or uint16_t for bf16 bit patterns.
template <typename P>
struct AdamPointersT {
  P* param;
  const P* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;
};
using AdamPointers = AdamPointersT<float>;
using AdamBf16Pointers = AdamPointersT<uint16_t>;

struct SgdCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = -1e-3f;
  float trust = 1.0f;  // LARS: (g + weight_decay * p) is multiplied by this before momentum
  bool maximize = false;
  bool scaled = false;
  bool nesterov = false;
  bool first_step = false;
};

template <typename P>
struct SgdPointersT {
  P* param;
  const P* grad;
  float* momentum_buffer;  // null when momentum == 0; fp32 whatever P is
};
using SgdPointers = SgdPointersT<float>;
using SgdBf16Pointers = SgdPointersT<uint16_t>;

struct AdagradCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  float eps = 1e-10f;
  float neg_clr = -1e-2f;  // -lr / (1 + (step - 1) * lr_decay)
  bool maximize = false;
  bool scaled = false;
};

template <typename P>
struct AdagradPointersT {
  P* param;
  const P* grad;
  float* state_sum;  // fp32 whatever P is
};
using AdagradPointers = AdagradPointersT<float>;
using AdagradBf16Pointers = AdagradPointersT<uint16_t>;

struct LambCoeffs {
  float grad_scale = 1.0f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction1 = 1.0f;
  float bias_correction2 = 1.0f;
  float eps = 1e-6f;
  float weight_decay = 0.0f;
  float neg_lr_trust = -1e-3f;  // second pass: -lr * ||p|| / ||u||
  bool maximize = false;
  bool scaled = false;
};

struct LambPointers {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
};

/// Lamb's first pass over [begin, end): updates m and v, returns the sums of p^2 and u^2 (lanes added in a fixed
/// order, so a block's sums depend only on its data).
using LambMomentsFn = void (*)(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                               double* u_sq);
/// Lamb's second pass: recomputes u from the updated m and v and applies p += neg_lr_trust * u.
using LambApplyFn = void (*)(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c);
/// Sums of a^2 and b^2 over [begin, end) (LARS's norms of p and g).
using SumSquaresFn = void (*)(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq);

void lamb_moments_fp32_ref(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                           double* u_sq);
void lamb_moments_fp32_avx2(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                            double* u_sq);
void lamb_moments_fp32_avx512(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c, double* p_sq,
                              double* u_sq);
void lamb_apply_fp32_ref(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c);
void lamb_apply_fp32_avx2(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c);
void lamb_apply_fp32_avx512(const LambPointers& t, int64_t begin, int64_t end, const LambCoeffs& c);
void sum_squares_fp32_ref(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq);
void sum_squares_fp32_avx2(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq);
void sum_squares_fp32_avx512(const float* a, const float* b, int64_t begin, int64_t end, double* a_sq, double* b_sq);

using AdagradFn = void (*)(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
using AdagradBf16Fn = void (*)(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
using AdamFn = void (*)(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
using AdamBf16Fn = void (*)(const AdamBf16Pointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
using SgdFn = void (*)(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
using SgdBf16Fn = void (*)(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);

void adam_fp32_ref(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_fp32_avx2(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_fp32_avx512(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
// bf16 parameters and gradients, fp32 moments: widened on load, updated in fp32, rounded to nearest even on store.
void adam_bf16_ref(const AdamBf16Pointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_bf16_avx2(const AdamBf16Pointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_bf16_avx512(const AdamBf16Pointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);

void adagrad_fp32_ref(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_fp32_avx2(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_fp32_avx512(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_bf16_ref(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_bf16_avx2(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_bf16_avx512(const AdagradBf16Pointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);

void sgd_fp32_ref(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_fp32_avx2(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_fp32_avx512(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_bf16_ref(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_bf16_avx2(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_bf16_avx512(const SgdBf16Pointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);

}  // namespace ember::optim::kernels
