// What a GEMM or convolution may do to its result before storing it: the fused post-ops of ember's oneDNN
// layers. `y = op_n(...op_1(x·Wᵀ + b))`, where each op is an activation, the addition of a tensor of the
// output's shape (a residual) or the multiplication by one (the gate of a gated MLP: `act(x·W1ᵀ) * (x·W3ᵀ)` is the
// first Linear with the epilogue [act, multiply] and the second's output as operand). torch's modules map onto
// these one to one (python/ember/_optimize/inference).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ember/tensor_view.h"

namespace ember {

// MobileNets use hardswish(x) = x·relu6(x + 3)/6, hardsigmoid(x) = relu6(x + 3)/6 and relu6(x) = min(max(x, 0), 6),
// as torch defines them. The last five take the PostOp's parameters α and β (graph mode fuses them wherever a model
// writes them): mish(x) = x·tanh(softplus(x)); elu(x) = x for x > 0, α·(eˣ - 1) below; leaky_relu(x) = x for
// x >= 0, α·x below; clamp(x) = min(max(x, α), β), either bound infinite for none; affine(x) = α·x + β, a model's
// multiplication by or addition of a constant (x * c is affine(c, 0), x + c is affine(1, c), each one rounding as
// in torch).
enum class Activation : uint8_t {
  relu,
  gelu_erf,
  gelu_tanh,
  silu,
  sigmoid,
  tanh,
  hardswish,
  hardsigmoid,
  relu6,
  mish,
  elu,
  leaky_relu,
  clamp,
  affine
};

/// Every activation, in declaration order.
inline constexpr Activation kAllActivations[] = {
    Activation::relu, Activation::gelu_erf,   Activation::gelu_tanh,   Activation::silu,  Activation::sigmoid,
    Activation::tanh, Activation::hardswish,  Activation::hardsigmoid, Activation::relu6, Activation::mish,
    Activation::elu,  Activation::leaky_relu, Activation::clamp,       Activation::affine};

/// How many of the parameters α, β an activation takes: 1 for elu and leaky_relu, 2 for clamp and affine, else 0.
constexpr int parameter_count(Activation act) noexcept {
  switch (act) {
    case Activation::elu:
    case Activation::leaky_relu: return 1;
    case Activation::clamp:
    case Activation::affine: return 2;
    default: return 0;
  }
}

/// True for the activations that are clamps to bounds bf16 holds exactly (ReLU, ReLU6): of a bf16 value they give
/// a bf16 value, so applying one to a bf16-rounded value gives the rounding of applying it to the value. The
/// epilogue stores their bf16 results without rounding.
constexpr bool keeps_bf16_values(Activation act) noexcept {
  return act == Activation::relu || act == Activation::relu6;
}

/// True for either GELU (erf or tanh).
constexpr bool is_gelu(Activation act) noexcept { return act == Activation::gelu_erf || act == Activation::gelu_tanh; }

/// torch's spelling of each activation: "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish",
/// "hardsigmoid", "relu6", "mish", "elu", "leaky_relu", "clamp", "affine".
std::string_view activation_name(Activation act) noexcept;

struct PostOp {
  enum class Kind : uint8_t { activation, add, multiply };
  Kind kind = Kind::activation;
  Activation activation = Activation::relu;  // for Kind::activation
  float alpha = 0.0f;                        // the activation's parameters (parameter_count), else 0
  float beta = 0.0f;

  static PostOp act(Activation a, float alpha = 0.0f, float beta = 0.0f) noexcept {
    return {Kind::activation, a, alpha, beta};
  }
  static PostOp add() noexcept { return {Kind::add, Activation::relu, 0.0f, 0.0f}; }
  static PostOp multiply() noexcept { return {Kind::multiply, Activation::relu, 0.0f, 0.0f}; }
  bool takes_operand() const noexcept { return kind != Kind::activation; }
  bool operator==(const PostOp& o) const noexcept {
    return kind == o.kind && (takes_operand() || (activation == o.activation && alpha == o.alpha && beta == o.beta));
  }
};

/// The post-ops in the order they apply. At most one `add` or `multiply`: its operand is the call's `residual`
/// argument (the tensor operand of the epilogue, whichever of the two reads it).
using Epilogue = std::vector<PostOp>;

/// Throws ValueError naming `op` when the epilogue has more than one add or multiply, or an activation's parameters are
/// not what it takes: finite α for elu, leaky_relu and affine, finite β for affine, bounds α <= β (not NaN) for clamp,
/// and 0 for any parameter it does not take.
void check_epilogue(std::string_view op, const Epilogue& epilogue);
/// The post-ops' names joined by '+' in the order they apply ("add+gelu"; activation_name for activations), "" for
/// none: what EMBER_VERBOSE's lines show.
std::string epilogue_name(const Epilogue& epilogue);
/// True when the epilogue has an add or a multiply (the call then needs its tensor operand, `residual`).
bool has_operand(const Epilogue& epilogue) noexcept;

/// out = x * factor, element by element, each product computed in float32 and rounded once to out's dtype (torch's
/// mul of two tensors of one dtype): a squeeze-excitation's channel scale, factor a [N, C, 1, 1] scale viewed
/// expanded to x's [N, C, H, W].
///   x: float32 or bfloat16, any sizes and strides >= 0;
///   factor: x's dtype and sizes, any strides >= 0 (0 along the dimensions it broadcasts over);
///   out: x's dtype and sizes, dense (any order of dimensions), sharing no memory with x or factor.
/// Each element's value does not depend on the thread count. Checked before anything is written.
void multiply(const TensorView& x, const TensorView& factor, const TensorView& out);

}  // namespace ember
