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

struct AdamPointers {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;
};

struct SgdCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = -1e-3f;
  bool maximize = false;
  bool scaled = false;
  bool nesterov = false;
  bool first_step = false;
};

struct SgdPointers {
  float* param;
  const float* grad;
  float* momentum_buffer;  // null when momentum == 0
};

struct AdagradCoeffs {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;
  float eps = 1e-10f;
  float neg_clr = -1e-2f;  // -lr / (1 + (step - 1) * lr_decay)
  bool maximize = false;
  bool scaled = false;
};

struct AdagradPointers {
  float* param;
  const float* grad;
  float* state_sum;
};

using AdagradFn = void (*)(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
using AdamFn = void (*)(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
using SgdFn = void (*)(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);

void adam_fp32_ref(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_fp32_avx2(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);
void adam_fp32_avx512(const AdamPointers& t, int64_t begin, int64_t end, const AdamCoeffs& c);

void adagrad_fp32_ref(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_fp32_avx2(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);
void adagrad_fp32_avx512(const AdagradPointers& t, int64_t begin, int64_t end, const AdagradCoeffs& c);

void sgd_fp32_ref(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_fp32_avx2(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);
void sgd_fp32_avx512(const SgdPointers& t, int64_t begin, int64_t end, const SgdCoeffs& c);

}  // namespace ember::optim::kernels
