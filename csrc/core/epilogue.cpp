#include "ember/epilogue.h"

#include <algorithm>
#include <cmath>

#include "ember/errors.h"

namespace ember {

std::string_view activation_name(Activation act) noexcept {
  switch (act) {
    case Activation::relu: return "relu";
    case Activation::gelu_erf: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::sigmoid: return "sigmoid";
    case Activation::tanh: return "tanh";
    case Activation::hardswish: return "hardswish";
    case Activation::hardsigmoid: return "hardsigmoid";
    case Activation::relu6: return "relu6";
    case Activation::mish: return "mish";
    case Activation::elu: return "elu";
    case Activation::leaky_relu: return "leaky_relu";
    case Activation::clamp: return "clamp";
    case Activation::affine: return "affine";
  }
  return "unknown";
}

std::string epilogue_name(const Epilogue& epilogue) {
  std::string name;
  for (const PostOp& op : epilogue) {
    if (!name.empty()) name += '+';
    switch (op.kind) {
      case PostOp::Kind::add: name += "add"; break;
      case PostOp::Kind::multiply: name += "multiply"; break;
      case PostOp::Kind::activation: name += activation_name(op.activation); break;
    }
  }
  return name;
}

bool has_operand(const Epilogue& epilogue) noexcept {
  return std::any_of(epilogue.begin(), epilogue.end(), [](const PostOp& op) { return op.takes_operand(); });
}

void check_epilogue(std::string_view op, const Epilogue& epilogue) {
  const auto binary =
      std::count_if(epilogue.begin(), epilogue.end(), [](const PostOp& p) { return p.takes_operand(); });
  EMBER_CHECK(binary <= 1, ValueError, op, ": epilogue may hold at most one add or multiply (it has one operand), got ",
              binary);
  for (const PostOp& p : epilogue) {
    if (p.kind != PostOp::Kind::activation) continue;
    const std::string_view name = activation_name(p.activation);
    const int count = parameter_count(p.activation);
    EMBER_CHECK(count >= 1 || p.alpha == 0.0f, ValueError, op, ": ", name, " takes no parameter, got ", p.alpha);
    EMBER_CHECK(count >= 2 || p.beta == 0.0f, ValueError, op, ": ", name, " takes one parameter, got a second ",
                p.beta);
    if (p.activation == Activation::clamp) {
      EMBER_CHECK(p.alpha <= p.beta, ValueError, op, ": clamp needs min <= max (neither NaN), got ", p.alpha, " and ",
                  p.beta);
    } else {
      EMBER_CHECK(std::isfinite(p.alpha) && std::isfinite(p.beta), ValueError, op, ": ", name,
                  " needs finite parameters, got ", p.alpha, " and ", p.beta);
    }
  }
}

}  // namespace ember
