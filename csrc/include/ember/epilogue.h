// What a GEMM or convolution may do to its result before storing it: the fused post-ops of ember's oneDNN
// layers. `y = op_n(...op_1(x·Wᵀ + b))`, where each op is an activation or the addition of a tensor of the
// output's shape (a residual). torch's modules map onto these one to one (python/ember/_optimize/inference).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ember {

// MobileNets use the last three: hardswish(x) = x·relu6(x + 3)/6, hardsigmoid(x) = relu6(x + 3)/6, and
// relu6(x) = min(max(x, 0), 6), as torch defines them.
enum class Activation : uint8_t { relu, gelu_erf, gelu_tanh, silu, sigmoid, tanh, hardswish, hardsigmoid, relu6 };

/// Every activation, in declaration order.
inline constexpr Activation kAllActivations[] = {Activation::relu,      Activation::gelu_erf,    Activation::gelu_tanh,
                                                 Activation::silu,      Activation::sigmoid,     Activation::tanh,
                                                 Activation::hardswish, Activation::hardsigmoid, Activation::relu6};

/// True for the activations that are clamps to bounds bf16 holds exactly (ReLU, ReLU6): of a bf16 value they give
/// a bf16 value, so applying one to a bf16-rounded value gives the rounding of applying it to the value. The
/// epilogue stores their bf16 results without rounding.
constexpr bool keeps_bf16_values(Activation act) noexcept {
  return act == Activation::relu || act == Activation::relu6;
}

/// torch's spelling of each activation: "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish",
/// "hardsigmoid", "relu6".
std::string_view activation_name(Activation act) noexcept;

struct PostOp {
  enum class Kind : uint8_t { activation, add };
  Kind kind = Kind::activation;
  Activation activation = Activation::relu;  // for Kind::activation

  static PostOp act(Activation a) noexcept { return {Kind::activation, a}; }
  static PostOp add() noexcept { return {Kind::add, Activation::relu}; }
  bool operator==(const PostOp& o) const noexcept {
    return kind == o.kind && (kind == Kind::add || activation == o.activation);
  }
};

/// The post-ops in the order they apply. At most one `add`: its operand is the call's `residual` argument.
using Epilogue = std::vector<PostOp>;

/// Throws ValueError naming `op` when the epilogue has more than one add.
void check_epilogue(std::string_view op, const Epilogue& epilogue);
/// True when the epilogue has an add (the call then needs a residual).
bool has_add(const Epilogue& epilogue) noexcept;

}  // namespace ember
