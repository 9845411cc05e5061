"""The elementwise operations a fused layer applies to its output, each as the kernel's epilogue entry and as the
torch operation the graph held, which runs whenever the kernel does not take a call.

A step keeps torch's exact operation for that path (``x * 0.5``, not an affine map with a zero shift), so a fused
node that falls back computes, operation for operation, what the graph computed before it was fused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ember._graph.ops import Call

# Activations whose kernel entry is their vocabulary name and whose torch operation takes only the input.
_PLAIN: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
}


@dataclass(frozen=True)
class Step:
    """One operation after the layer: ``op`` is an activation of the vocabulary (ember._graph.ops), ``"mul"`` or
    ``"add"`` by the constant ``value``, ``"residual"`` (the addition of the fused call's tensor operand) or
    ``"product"`` (the multiplication by it: a gated MLP's ``act(x W1) * (x W3)``).
    ``params`` are the activation's (gelu's approximation, elu's alpha, a clamp's bounds)."""

    op: str
    params: tuple[Any, ...] = ()
    value: float = 0.0

    @property
    def takes_operand(self) -> bool:
        return self.op in ("residual", "product")

    @property
    def entry(self) -> str:
        """The kernel's epilogue entry (python/csrc/onednn_binding.cpp reads it)."""
        if self.op == "residual":
            return "add"
        if self.op == "product":
            return "mul"
        if self.op == "mul":
            return f"affine({self.value!r}, 0)"
        if self.op == "add":
            return f"affine(1, {self.value!r})"
        if self.op == "gelu":
            return "gelu_tanh" if self.params[0] == "tanh" else "gelu"
        if self.op in _PLAIN:
            return self.op
        return f"{self.op}({', '.join(repr(float(p)) for p in self.params)})"

    def apply(self, x: torch.Tensor, operand: torch.Tensor | None) -> torch.Tensor:
        """The step as torch computes it."""
        if self.takes_operand:
            assert operand is not None  # a node with such a step is always called with its operand
            return x + operand if self.op == "residual" else x * operand
        if self.op == "mul":
            return x * self.value
        if self.op == "add":
            return x + self.value
        if self.op == "gelu":
            return F.gelu(x, approximate=self.params[0])
        if self.op == "elu":
            return F.elu(x, self.params[0])
        if self.op == "leaky_relu":
            return F.leaky_relu(x, self.params[0])
        if self.op == "clamp":
            low, high = self.params
            return torch.clamp(x, None if low == -math.inf else low, None if high == math.inf else high)
        return _PLAIN[self.op](x)


def apply_steps(steps: tuple[Step, ...], x: torch.Tensor, operand: torch.Tensor | None) -> torch.Tensor:
    for step in steps:
        x = step.apply(x, operand)
    return x


def _scalar(value: Any) -> float | None:
    """A finite Python number operand (not a bool, not a tensor). The kernel's epilogue holds it in fp32, as torch's
    CPU kernels do for an fp32 or bf16 tensor's arithmetic with a scalar."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None


def step_of(call: Call, value: fx.Node, has_operand: bool) -> tuple[Step, fx.Node | None] | None:
    """The step ``call`` is when it applies to ``value`` (the fused layer's output so far), and the tensor node it
    adds or multiplies by, if any (the caller checks that one has the output's shape); None when it is not a step
    the kernel applies (a second tensor operand, an in-place operation on another tensor, parameters the kernel
    refuses)."""
    operands = call.operands
    op = call.op
    if op in ("add", "mul"):
        first, other = operands["input"], operands["other"]
        if first is not value:
            first, other = other, first
        if first is not value or other is value:
            return None
        if op == "add" and operands.get("alpha", 1) != 1:
            return None
        if (scalar := _scalar(other)) is not None:
            return Step(op, value=scalar), None
        if isinstance(other, fx.Node) and not has_operand:
            return Step("residual" if op == "add" else "product"), other
        return None
    if operands.get("input") is not value:
        return None
    if op in _PLAIN:
        return Step(op), None
    if op == "gelu":
        approximate = operands.get("approximate", "none")
        return (Step("gelu", (approximate,)), None) if approximate in ("none", "tanh") else None
    if op == "elu":
        if operands.get("scale", 1) != 1 or operands.get("input_scale", 1) != 1:
            return None
        alpha = _scalar(operands.get("alpha", 1.0))
        return (Step("elu", (alpha,)), None) if alpha is not None else None
    if op == "leaky_relu":
        slope = _scalar(operands.get("negative_slope", 0.01))
        return (Step("leaky_relu", (slope,)), None) if slope is not None else None
    if op == "clamp":
        low, high = operands.get("min"), operands.get("max")
        bounds = (-math.inf if low is None else _scalar(low), math.inf if high is None else _scalar(high))
        if None in bounds or (low is None and high is None) or bounds[0] > bounds[1]:  # type: ignore[operator]
            return None
        return Step("clamp", bounds), None
    return None
