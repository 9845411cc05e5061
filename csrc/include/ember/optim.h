// Fused optimizer steps: every tensor of a parameter group updated in one parallel pass over memory.
//
// A group is a list of slots, one per parameter; each slot points at the parameter, its gradient and its state,
// all contiguous arrays of `numel` elements. The work of all slots is split into equal contiguous pieces across
// the thread budget (see multi_tensor.h), so a group of many small tensors costs one fork/join, not one per
// tensor. Each element's arithmetic depends only on its own values, so results are identical for any thread count.
//
// The formulas follow torch.optim's for-loop implementations term by term (documented per function), so fp32
// results agree with torch.optim to rounding.
//
// Parameter storages (the *Tensors entry points; each slot has its own):
//   float32 parameter, float32 gradient;
//   bfloat16 parameter, bfloat16 gradient: widened, updated in fp32, rounded to nearest even (NaN stays NaN);
//   split-BF16: bfloat16 parameter (the top half) with an int16 `bottoms[i]` (the bottom half; ember/bf16.h), and
//   a bfloat16 gradient: the halves are joined into the exact fp32 value, updated, and split again, in one pass.
// Optimizer state is float32 for every storage. Bytes per element for Adam: 28 (fp32), 22 (bf16), 26 (split-BF16).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ember/tensor_view.h"

namespace ember::optim {

/// Optional mixed-precision controls, as torch's fused optimizers take them: gradients are divided by
/// *grad_scale, and when *found_inf is non-zero the step is skipped entirely (no state or step count changes).
struct AmpScalars {
  const float* grad_scale = nullptr;
  const float* found_inf = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// Adam / AdamW (torch.optim.Adam, torch.optim.AdamW; _single_tensor_adam):
//   step += 1
//   g = maximize ? -grad : grad;  g /= grad_scale (if given)
//   decoupled (AdamW):  p *= 1 - lr * weight_decay          else:  g = g + weight_decay * p
//   m = m + (1 - beta1) * (g - m)                           (torch's lerp for a weight below 0.5)
//   v = v * beta2 + (1 - beta2) * g * g
//   amsgrad:  v_max = max(v_max, v);  v_hat = v_max         else:  v_hat = v
//   denom = sqrt(v_hat) / sqrt(1 - beta2^step) + eps
//   p = p - lr / (1 - beta1^step) * m / denom
// Bytes per element (fp32): reads p, g, m, v and writes p, m, v: 28 (36 with amsgrad).

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;
  bool amsgrad = false;
  bool maximize = false;
};

struct AdamSlot {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;  // amsgrad only
  float* step = nullptr;            // the slot's step count (a float, as torch stores it); incremented here
  int64_t numel = 0;
};

/// Throws ValueError for non-finite or out-of-range options (lr < 0, eps < 0, betas outside [0, 1),
/// weight_decay < 0), before anything is written.
void check_adam_options(const AdamOptions& options);
/// One Adam step over every slot. Slots must not overlap each other (unchecked here; see the binding's checks).
void adam_step(const std::vector<AdamSlot>& slots, const AdamOptions& options, const AmpScalars& amp = {});

/// The tensors of one group, as views (the binding's and other callers' entry point). Checked before anything is
/// written: every list as long as `params` (max_exp_avg_sqs: empty unless amsgrad; bottoms: empty or one entry
/// per parameter, nullopt for a parameter that is not split); params float32 or bfloat16 with grads of their dtype;
/// state float32; everything dense and of its parameter's shape and memory layout; steps of one element; no written
/// tensor sharing memory with any other tensor of the call.
struct AdamTensors {
  std::vector<TensorView> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  std::vector<std::optional<TensorView>> bottoms = {};  // split-BF16 bottom halves (int16)
};
/// grad_scale and found_inf, when given, are one-element float32 tensors.
void adam_step(const AdamTensors& tensors, const AdamOptions& options, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf);

// ---------------------------------------------------------------------------------------------------------------
// SGD (torch.optim.SGD; _single_tensor_sgd):
//   g = maximize ? -grad : grad;  g /= grad_scale (if given);  g = g + weight_decay * p
//   momentum != 0:  buf = first step ? g : buf * momentum + (1 - dampening) * g
//                   g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// Bytes per element (fp32): reads p, g (and buf), writes p (and buf): 12 (20 with momentum).

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

struct SgdSlot {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buffer = nullptr;  // required when momentum != 0
  bool first_step = false;           // the buffer holds nothing yet: it becomes g
  int64_t numel = 0;
};

void check_sgd_options(const SgdOptions& options);
void sgd_step(const std::vector<SgdSlot>& slots, const SgdOptions& options, const AmpScalars& amp = {});

/// momentum_buffers: empty when momentum == 0, else one per parameter; first_step[i] says buffer i is new.
/// Checked as AdamTensors are.
struct SgdTensors {
  std::vector<TensorView> params, grads, momentum_buffers;
  std::vector<bool> first_step;
  std::vector<std::optional<TensorView>> bottoms = {};  // split-BF16 bottom halves (int16)
};
void sgd_step(const SgdTensors& tensors, const SgdOptions& options, const std::optional<TensorView>& grad_scale,
              const std::optional<TensorView>& found_inf);

// ---------------------------------------------------------------------------------------------------------------
// Adagrad (torch.optim.Adagrad; _single_tensor_adagrad; Duchi, Hazan & Singer, 2011):
//   step += 1
//   g = maximize ? -grad : grad;  g /= grad_scale (if given);  g = g + weight_decay * p
//   clr = lr / (1 + (step - 1) * lr_decay)
//   sum = sum + g * g
//   p = p - clr * g / (sqrt(sum) + eps)
// Bytes per element (fp32): reads p, g, sum and writes p, sum: 20.

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double eps = 1e-10;
  bool maximize = false;
};

/// Checked as AdamTensors are.
struct AdagradTensors {
  std::vector<TensorView> params, grads, state_sums, steps;
  std::vector<std::optional<TensorView>> bottoms = {};  // split-BF16 bottom halves (int16)
};

void check_adagrad_options(const AdagradOptions& options);
void adagrad_step(const AdagradTensors& tensors, const AdagradOptions& options,
                  const std::optional<TensorView>& grad_scale, const std::optional<TensorView>& found_inf);

// ---------------------------------------------------------------------------------------------------------------
// Lamb (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes", ICLR 2020; the
// form of NVIDIA's FusedLAMB and IPEX's Lamb):
//   step += 1
//   g = maximize ? -grad : grad;  g /= grad_scale (if given)
//   m = m + (1 - beta1) * (g - m);   v = v * beta2 + (1 - beta2) * g * g
//   u = (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * p   (no bias correction: 1)
//   trust = ||p|| > 0 and ||u|| > 0 ? ||p|| / ||u|| : 1          (norms of the whole tensor)
//   p = p - lr * trust * u
// Two passes: the first updates m and v and sums p^2 and u^2 per tensor, the second recomputes u and updates p.
// The gradient is never written. Bytes per element: 24 + 16 = 40.

struct LambOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool maximize = false;
};

/// Checked as AdamTensors are.
struct LambTensors {
  std::vector<TensorView> params, grads, exp_avgs, exp_avg_sqs, steps;
  std::vector<std::optional<TensorView>> bottoms = {};  // split-BF16 bottom halves (int16)
};

void check_lamb_options(const LambOptions& options);
void lamb_step(const LambTensors& tensors, const LambOptions& options, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf);

// ---------------------------------------------------------------------------------------------------------------
// LARS (You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks", 2017; the form of SimCLR's and
// Lightning Bolts' LARS):
//   g = maximize ? -grad : grad;  g /= grad_scale (if given)
//   trust = ||p|| > 0 and ||g|| > 0 ? trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps) : 1
//   d = (g + weight_decay * p) * trust
//   then SGD with momentum on d:  buf = first step ? d : buf * momentum + (1 - dampening) * d;
//   d = nesterov ? d + momentum * buf : buf;  p = p - lr * d
// Two passes: norms of p and g (8 bytes per element), then the update (12, or 20 with momentum).

struct LarsOptions {
  double lr = 1e-3;
  double momentum = 0.9;
  double dampening = 0.0;
  double weight_decay = 0.0;
  double trust_coefficient = 1e-3;
  double eps = 1e-8;
  bool nesterov = false;
  bool maximize = false;
};

void check_lars_options(const LarsOptions& options);
void lars_step(const SgdTensors& tensors, const LarsOptions& options, const std::optional<TensorView>& grad_scale,
               const std::optional<TensorView>& found_inf);

}  // namespace ember::optim
