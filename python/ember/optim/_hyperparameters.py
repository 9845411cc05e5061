"""The hyper-parameters of ember's optimizers as torch.optim has them: each group's keys and defaults, asked of the
running torch, and the checks torch makes on them, in torch's wording."""

from __future__ import annotations

import math
from typing import Any

import torch

_TORCH_GROUP_DEFAULTS: dict[type, dict[str, Any]] = {}


def torch_group_defaults(torch_class: type) -> dict[str, Any]:
    """The keys and default values of a param group of ``torch_class`` in the running torch version (asked of
    torch itself, once, with a throwaway parameter)."""
    if torch_class not in _TORCH_GROUP_DEFAULTS:
        # lr given: torch 1.13's SGD has no default learning rate.
        probe = torch_class([torch.zeros(1, requires_grad=True)], lr=1e-3)
        defaults = {k: v for k, v in probe.param_groups[0].items() if k != "params"}
        defaults.pop("lr")
        _TORCH_GROUP_DEFAULTS[torch_class] = defaults
    return dict(_TORCH_GROUP_DEFAULTS[torch_class])


def check_finite(
    name: str, value: float | torch.Tensor, *, low: float | None = None, below: float | None = None
) -> float:
    """Returns float(value), or raises ValueError naming the hyper-parameter (torch's wording where it has one)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"Tensor {name} must be 1-element")
        value = value.item()
    value = float(value)  # a bool or an int from a user, a float from item()
    if not math.isfinite(value):
        raise ValueError(f"Invalid {name} value: {value} (must be finite)")
    if low is not None and value < low:
        raise ValueError(f"Invalid {name} value: {value}")
    if below is not None and value >= below:
        raise ValueError(f"Invalid {name} value: {value}")
    return value


def check_adam_hyperparameters(group: dict[str, Any]) -> None:
    """lr, eps, weight_decay and betas of Adam-like optimizers (Adam, AdamW, Lamb)."""
    check_finite("learning rate", group["lr"], low=0.0)
    check_finite("epsilon", group["eps"], low=0.0)
    check_finite("weight_decay", group["weight_decay"], low=0.0)
    check_betas(group)


def check_momentum_hyperparameters(group: dict[str, Any]) -> None:
    """lr, momentum, dampening, weight_decay and nesterov of SGD-like optimizers (SGD, LARS)."""
    check_finite("learning rate", group["lr"], low=0.0)
    momentum = check_finite("momentum", group["momentum"], low=0.0)
    dampening = check_finite("dampening", group["dampening"])
    check_finite("weight_decay", group["weight_decay"], low=0.0)
    if group["nesterov"] and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def check_betas(group: dict[str, Any]) -> None:
    """The (beta1, beta2) pair of Adam-like optimizers: each in [0, 1)."""
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Invalid betas: {betas!r} (expected a pair)")
    check_finite("beta parameter at index 0", betas[0], low=0.0, below=1.0)
    check_finite("beta parameter at index 1", betas[1], low=0.0, below=1.0)
