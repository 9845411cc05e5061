// The float64 reference of each post-op, shared by the tests of the oneDNN layers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ember/epilogue.h"
#include "random_matrix.h"

namespace ember::testing {

/// Each activation with parameters a model would give it (the tests' default; 0 for those that take none).
inline PostOp example_post_op(Activation act) {
  switch (act) {
    case Activation::elu: return PostOp::act(act, 0.7f);
    case Activation::leaky_relu: return PostOp::act(act, 0.1f);
    case Activation::clamp: return PostOp::act(act, -1.5f, 2.0f);
    case Activation::affine: return PostOp::act(act, 1.75f, -0.25f);
    default: return PostOp::act(act);
  }
}

inline double apply(const PostOp& op, double x) {
  const double alpha = op.alpha, beta = op.beta;
  switch (op.activation) {
    case Activation::relu:
      return x < 0 ? 0 : x;  // NaN stays NaN, as in torch
    // The GELUs in forms that do not cancel where the result is tiny: 1 + erf(x/√2) = erfc(-x/√2), and
    // 1 + tanh(u) = 2/(1 + e^-2u) (in float64, 1 + tanh(u) is 0 from u ~ -19 on).
    case Activation::gelu_erf: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::gelu_tanh: return x / (1 + std::exp(-2 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::silu: return x / (1 + std::exp(-x));
    case Activation::sigmoid: return 1 / (1 + std::exp(-x));
    case Activation::tanh: return std::tanh(x);
    case Activation::hardswish: return x * std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case Activation::hardsigmoid: return std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case Activation::relu6: return std::min(std::max(x, 0.0), 6.0);
    case Activation::mish: return x * std::tanh(std::log1p(std::exp(x)));
    case Activation::elu: return x > 0 ? x : alpha * std::expm1(x);
    case Activation::leaky_relu: return x < 0 ? alpha * x : x;
    case Activation::clamp: return std::isnan(x) ? x : std::min(std::max(x, alpha), beta);
    case Activation::affine: {
      // torch rounds x * c and then + c' to fp32 each.
      const double scaled = static_cast<float>(alpha * x);
      return static_cast<float>(scaled + beta);
    }
  }
  return x;
}

/// A layer's output through its epilogue, in float64, from the layer's sum (bias included) and the residual's
/// element (ignored without an add or multiply): the output's `value`, and `bf16_slack`, how far a bf16 output may
/// stray from it because oneDNN's paths store the value reaching the first activation or multiply in bf16 and run the
/// activations from that, as autocast does (onednn::EpilogueSplit): the most the rest of the chain moves when that
/// value moves by one bf16 rounding (2^-8 relative) either way. The slack is 0 without an activation or for a
/// non-finite value.
struct ChainReference {
  double value;
  double bf16_slack;
};

inline ChainReference reference_chain(const Epilogue& epilogue, double sum, double residual) {
  const auto first =
      std::find_if(epilogue.begin(), epilogue.end(), [](const PostOp& op) { return op.kind != PostOp::Kind::add; });
  const auto run = [&](auto begin, auto end, double v) {
    for (auto op = begin; op != end; ++op) {
      v = op->kind == PostOp::Kind::add        ? v + residual
          : op->kind == PostOp::Kind::multiply ? v * residual
                                               : apply(*op, v);
    }
    return v;
  };
  const double stored = run(epilogue.begin(), first, sum);
  const double value = run(first, epilogue.end(), stored);
  if (first == epilogue.end() || !std::isfinite(stored)) return {value, 0.0};
  const double step = std::ldexp(std::fabs(stored), -8);
  const double slack = std::max(std::fabs(run(first, epilogue.end(), stored - step) - value),
                                std::fabs(run(first, epilogue.end(), stored + step) - value));
  return {value, std::isfinite(slack) ? slack : 0.0};
}

/// Output (i, j) of an ember matmul kernel that computes its epilogue in fp32 from fp32 sums (the skinny and tile
/// matmuls): row i of x against row j of w plus `bias`, through the epilogue in float64 (`residual` read by an add or
/// multiply), and the scale of its fp32 rounding error, the sum of the magnitudes along the way.
struct OutputReference {
  double value, scale;
};

inline OutputReference matmul_reference(const Matrix& x, int64_t i, const Matrix& w, int64_t j, double bias,
                                        const Epilogue& epilogue, const Matrix& residual) {
  double acc = bias, scale = std::fabs(bias);
  for (int64_t p = 0; p < x.cols; ++p) {
    acc += x.at(i, p) * w.at(j, p);
    scale += std::fabs(x.at(i, p) * w.at(j, p));
  }
  for (const PostOp& op : epilogue) {
    if (op.kind == PostOp::Kind::add) {
      acc += residual.at(i, j);
      scale += std::fabs(residual.at(i, j));
    } else if (op.kind == PostOp::Kind::multiply) {
      acc *= residual.at(i, j);
      scale *= std::fabs(residual.at(i, j));
    } else {
      acc = apply(op, acc);
    }
  }
  return {acc, scale};
}

/// A result against its float64 reference where either may be non-finite: NaN exactly where the reference is NaN,
/// the same infinity, else within `tol`.
inline ::testing::AssertionResult matches_reference(double got, double want, double tol) {
  const bool ok = std::isnan(want) ? std::isnan(got) : std::isinf(want) ? got == want : std::fabs(got - want) <= tol;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (tolerance " << tol << ")";
}

}  // namespace ember::testing
