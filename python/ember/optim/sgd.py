"""SGD, fused: a drop-in replacement for torch.optim.SGD."""

from __future__ import annotations

import functools
from collections.abc import Iterable, MutableMapping
from typing import Any

import torch

from ember import _C
from ember._profiling import kernel_range
from ember.optim._base import FusedOptimizer
from ember.optim._hyperparameters import check_momentum_hyperparameters
from ember.optim._plan import grad_capsules
from ember.optim._state import init_momentum_state, momentum_state_keys


@functools.cache
def _torch_stores_absent_buffers() -> bool:
    """Whether the running torch.optim.SGD records ``momentum_buffer: None`` without momentum (torch < 2.0 does),
    asked of torch once, so that ember's state_dict has the same entries."""
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    opt = torch.optim.SGD([p], lr=0.1)
    opt.step()
    return "momentum_buffer" in opt.state[p]


class SGD(FusedOptimizer):
    r"""Stochastic gradient descent with momentum, with torch.optim.SGD's arguments, defaults, state and results.

    Per parameter, in torch.optim's order (``_single_tensor_sgd``):

    .. math::
        g &\leftarrow \pm\nabla + \lambda\theta \\
        b &\leftarrow g \text{ (first step)},\quad b \leftarrow \mu b + (1-\tau) g \text{ (later)},\qquad
        g \leftarrow g + \mu b \text{ (nesterov)} \text{ or } g \leftarrow b \\
        \theta &\leftarrow \theta - \gamma g

    (momentum terms only when momentum is non-zero). The whole group is updated in one parallel pass over
    memory. Parameters are float32, bfloat16 (rounded to nearest even once per step) or split-BF16 (see
    :class:`~ember.optim.FusedOptimizer`); the momentum buffer is float32 for all. ``foreach`` and ``fused`` are
    accepted and ignored; ``differentiable`` raises NotImplementedError.
    Parameters with sparse gradients (embeddings with ``sparse=True``) are stepped by torch.optim.SGD's own
    implementation on the same state; ember's sparse kernels come with its merged embedding bags.
    """

    _torch_class = torch.optim.SGD

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        self._init(params, locals())

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        check_momentum_hyperparameters(group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return momentum_state_keys(group)

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        if group["momentum"] != 0:
            init_momentum_state(p, state)
        elif _torch_stores_absent_buffers():
            state.setdefault("momentum_buffer", None)

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params, grads = self._dense_params_with_grad(group, grad_scale, found_inf)
        if not params:
            return
        momentum = float(group["momentum"])
        with self._planned_step(group, params) as plan, kernel_range("sgd_step"):
            _C.sgd_step(
                plan.param_capsules,
                grad_capsules(params, grads),
                plan.state_capsules[0] if momentum != 0.0 else [],
                plan.fresh("momentum_buffer") if momentum != 0.0 else [],
                _C.SgdOptions(
                    lr=float(group["lr"]),
                    momentum=momentum,
                    dampening=float(group["dampening"]),
                    weight_decay=float(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]),
                    maximize=bool(group.get("maximize", False)),
                ),
                grad_scale=grad_scale,
                found_inf=found_inf,
                bottoms=plan.bottom_capsules,
            )
