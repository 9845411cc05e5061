"""The optimizer state ember's optimizers keep, created as torch.optim creates it (same keys, fp32 buffers), so
``state_dict()`` moves between them and torch.optim in both directions."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch


def fp32_zeros_like(p: torch.Tensor) -> torch.Tensor:
    """A state buffer: float32 whatever the parameter's dtype, in the parameter's memory layout."""
    return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)


ADAM_STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")  # Adam, AdamW and Lamb, in the order their kernels take them


def momentum_state_keys(group: dict[str, Any]) -> tuple[str, ...]:
    """The state SGD-like optimizers (SGD, LARS) pass their kernels: the momentum buffer, when momentum is on."""
    return ("momentum_buffer",) if group["momentum"] != 0 else ()


def init_adam_state(p: torch.Tensor, state: MutableMapping[str, Any]) -> None:
    """step, exp_avg and exp_avg_sq of an Adam-like optimizer (Adam, AdamW, Lamb), created as torch.optim.Adam
    creates them on a parameter's first step (the moments float32 whatever the parameter's dtype)."""
    if len(state) == 0:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = fp32_zeros_like(p)
        state["exp_avg_sq"] = fp32_zeros_like(p)


def init_momentum_state(p: torch.Tensor, state: MutableMapping[str, Any]) -> None:
    """The momentum buffer of an SGD-like optimizer (SGD, LARS), where it is missing: left uninitialised, because
    the kernel sets it to the first step's direction (as torch.optim.SGD clones it) for the parameters whose
    buffer :meth:`StepPlan.fresh` reports new; float32 whatever the parameter's dtype."""
    if state.get("momentum_buffer") is None:
        state["momentum_buffer"] = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
