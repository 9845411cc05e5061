#include "ember/epilogue.h"

#include <algorithm>

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
  }
  return "unknown";
}

bool has_add(const Epilogue& epilogue) noexcept {
  return std::any_of(epilogue.begin(), epilogue.end(), [](const PostOp& op) { return op.kind == PostOp::Kind::add; });
}

void check_epilogue(std::string_view op, const Epilogue& epilogue) {
  const auto adds =
      std::count_if(epilogue.begin(), epilogue.end(), [](const PostOp& p) { return p.kind == PostOp::Kind::add; });
  EMBER_CHECK(adds <= 1, ValueError, op, ": epilogue may hold at most one add, got ", adds);
}

}  // namespace ember
