// Argument checks shared by the optimizer entry points. Each throws before anything is written, with a message
// naming the optimizer, the argument and what was expected.
#pragma once

#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

#include "ember/errors.h"
#include "ember/optim.h"
#include "ember/tensor_view.h"
#include "optim_kernels.h"
#include "storage_dispatch.h"

namespace ember::optim::detail {

inline void check_unit_interval(std::string_view op, std::string_view name, double value) {
  EMBER_CHECK(std::isfinite(value) && value >= 0.0 && value < 1.0, ValueError, op, ": ", name,
              " must be in [0, 1), got ", value);
}

inline void check_list_length(std::string_view op, std::string_view name, size_t got, size_t expected) {
  EMBER_CHECK(got == expected, ValueError, op, ": ", name, " must hold ", expected, " tensors, got ", got);
}

/// Dense (contiguous in some dimension order: channels-last parameters qualify) and, with `like`, of its shape and
/// memory layout, so that the kernels can walk all of a slot's tensors as flat arrays.
inline void check_dense_like(std::string_view op, std::string_view list, size_t i, const TensorView& t,
                             const TensorView* like) {
  EMBER_CHECK(t.is_dense(), ValueError, op, ": ", list, "[", i,
              "] must be dense (contiguous in some order of its dimensions), got ", t.describe(),
              " with gaps or overlaps");
  if (like != nullptr) {
    EMBER_CHECK(t.same_layout(*like), ValueError, op, ": ", list, "[", i, "] must have the shape and memory layout ",
                "of params[", i, "] (", like->describe(), "), got ", t.describe());
  }
}

/// A float32 dense tensor; with `like`, of its shape and memory layout.
inline void check_float_tensor(std::string_view op, std::string_view list, size_t i, const TensorView& t,
                               const TensorView* like) {
  EMBER_CHECK(t.dtype() == DType::f32, TypeError, op, ": ", list, "[", i, "] must have dtype float32, got ",
              dtype_name(t.dtype()));
  check_dense_like(op, list, i, t, like);
}

/// A parameter or gradient of an optimizer that takes bf16 parameters too: float32 or bfloat16, dense; a gradient
/// (`param` given) of its parameter's dtype, shape and layout.
inline void check_param_or_grad(std::string_view op, std::string_view list, size_t i, const TensorView& t,
                                const TensorView* param) {
  EMBER_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, TypeError, op, ": ", list, "[", i,
              "] must have dtype float32 or bfloat16, got ", dtype_name(t.dtype()));
  if (param != nullptr) {
    EMBER_CHECK(t.dtype() == param->dtype(), TypeError, op, ": ", list, "[", i, "] must have the dtype of params[", i,
                "] (", dtype_name(param->dtype()), "), got ", dtype_name(t.dtype()));
  }
  check_dense_like(op, list, i, t, param);
}

/// bottoms: empty, or one entry per parameter.
inline void check_bottoms_length(std::string_view op, size_t got, size_t params) {
  EMBER_CHECK(got == 0 || got == params, ValueError, op, ": bottoms must be empty or hold ", params,
              " entries (one per parameter), got ", got);
}

/// The storage of slot i: split-BF16 when bottoms[i] is given (then params[i] must be the bfloat16 top half and
/// bottoms[i] an int16 tensor of its shape and layout, added to `items` as written), else its parameter's dtype.
/// Call after checking params[i] with check_param_or_grad.
inline kernels::StorageKind check_storage(std::string_view op, size_t i, const TensorView& param,
                                          const std::vector<std::optional<TensorView>>& bottoms,
                                          std::vector<check::ListItem>& items) {
  const std::optional<TensorView>* given = bottoms.empty() ? nullptr : &bottoms[i];
  if (given == nullptr || !given->has_value()) {
    return param.dtype() == DType::bf16 ? kernels::StorageKind::bf16 : kernels::StorageKind::fp32;
  }
  const TensorView& bottom = **given;
  EMBER_CHECK(param.dtype() == DType::bf16, TypeError, op, ": params[", i, "] must be bfloat16 (the top half) when ",
              "bottoms[", i, "] is given, got ", dtype_name(param.dtype()));
  EMBER_CHECK(bottom.dtype() == DType::i16, TypeError, op, ": bottoms[", i, "] must have dtype int16, got ",
              dtype_name(bottom.dtype()));
  check_dense_like(op, "bottoms", i, bottom, &param);
  items.push_back({"bottoms", i, &bottom, true});
  return kernels::StorageKind::split;
}

/// Checks params[i], grads[i] and bottoms[i] (if any) of an optimizer that takes every storage, adds them to
/// `items`, and returns the slot's parameter part.
inline ParamSlot check_param_slot(std::string_view op, size_t i, const std::vector<TensorView>& params,
                                  const std::vector<TensorView>& grads,
                                  const std::vector<std::optional<TensorView>>& bottoms,
                                  std::vector<check::ListItem>& items) {
  check_param_or_grad(op, "params", i, params[i], nullptr);
  check_param_or_grad(op, "grads", i, grads[i], &params[i]);
  items.push_back({"params", i, &params[i], true});
  items.push_back({"grads", i, &grads[i], false});
  const kernels::StorageKind storage = check_storage(op, i, params[i], bottoms, items);
  uint16_t* bottom = nullptr;
  if (storage == kernels::StorageKind::split) {
    const std::optional<TensorView>& given = bottoms[i];  // check_storage found it given
    if (given.has_value()) bottom = given->data_as<uint16_t>();
  }
  return {params[i].data(), bottom, grads[i].data(), storage};
}

inline void check_scalar_tensor(std::string_view op, std::string_view list, size_t i, const TensorView& t) {
  EMBER_CHECK(t.dtype() == DType::f32, TypeError, op, ": ", list, "[", i, "] must have dtype float32, got ",
              dtype_name(t.dtype()));
  EMBER_CHECK(t.numel() == 1, ValueError, op, ": ", list, "[", i, "] must hold one element, got ", t.describe());
}

/// A float32 state tensor of params[i] (dense, of its shape and layout), added to `items` as written.
inline void check_state_tensor(std::string_view op, std::string_view list, size_t i, const TensorView& t,
                               const TensorView& param, std::vector<check::ListItem>& items) {
  check_float_tensor(op, list, i, t, &param);
  items.push_back({list, i, &t, true});
}

/// steps[i]: a one-element float32 step count, added to `items` as written.
inline void check_step_tensor(std::string_view op, size_t i, const TensorView& t, std::vector<check::ListItem>& items) {
  check_scalar_tensor(op, "steps", i, t);
  items.push_back({"steps", i, &t, true});
}

/// Checks grad_scale / found_inf (one-element float32), adds them to the aliasing check as read-only items and
/// returns their addresses.
inline AmpScalars amp_scalars(std::string_view op, const std::optional<TensorView>& grad_scale,
                              const std::optional<TensorView>& found_inf, std::vector<check::ListItem>& items) {
  AmpScalars amp;
  if (grad_scale) {
    check_scalar_tensor(op, "grad_scale", 0, *grad_scale);
    items.push_back({"grad_scale", 0, &*grad_scale, false});
    amp.grad_scale = grad_scale->data_as<const float>();
  }
  if (found_inf) {
    check_scalar_tensor(op, "found_inf", 0, *found_inf);
    items.push_back({"found_inf", 0, &*found_inf, false});
    amp.found_inf = found_inf->data_as<const float>();
  }
  return amp;
}

}  // namespace ember::optim::detail
