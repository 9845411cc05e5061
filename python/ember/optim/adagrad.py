"""Adagrad, fused: a drop-in replacement for torch.optim.Adagrad."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import torch

from ember import _C
from ember._profiling import kernel_range
from ember.optim._base import FusedOptimizer
from ember.optim._hyperparameters import check_finite
from ember.optim._plan import grad_capsules


class Adagrad(FusedOptimizer):
    r"""Adagrad (Duchi, Hazan & Singer, 2011) with torch.optim.Adagrad's arguments, defaults, state and results.

    Per parameter, in torch.optim's order (``_single_tensor_adagrad``), with :math:`t` its step count:

    .. math::
        g \leftarrow \pm\nabla + \lambda\theta,\qquad
        \tilde\gamma = \frac{\gamma}{1 + (t-1)\,\eta},\qquad
        s \leftarrow s + g^2,\qquad
        \theta \leftarrow \theta - \tilde\gamma\,\frac{g}{\sqrt{s} + \epsilon}

    (:math:`\eta` is ``lr_decay``; ``s`` starts at ``initial_accumulator_value``). As in torch, the state of every
    parameter is created at construction. One parallel pass over memory per group (20 bytes per fp32 parameter).
    Parameters are float32, bfloat16 (rounded once per step) or split-BF16 (see
    :class:`~ember.optim.FusedOptimizer`); the sum is float32 for all.
    ``foreach`` and ``fused`` are accepted and ignored; ``differentiable`` raises NotImplementedError. Parameters
    with sparse gradients are stepped by torch.optim.Adagrad's own implementation on the same state.
    """

    _torch_class = torch.optim.Adagrad

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        self._init(params, locals())
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, self.state[p], group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("sum", "step")

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        if len(state) == 0:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            value = float(group.get("initial_accumulator_value", self.defaults["initial_accumulator_value"]))
            # float32 whatever the parameter's dtype: bf16 parameters keep an fp32 sum of squares
            state["sum"] = torch.full_like(p, value, dtype=torch.float32, memory_format=torch.preserve_format)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        check_finite("learning rate", group["lr"], low=0.0)
        check_finite("lr_decay", group["lr_decay"], low=0.0)
        check_finite("weight_decay", group["weight_decay"], low=0.0)
        check_finite("initial_accumulator_value", group["initial_accumulator_value"], low=0.0)
        check_finite("epsilon", group["eps"], low=0.0)

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params, grads = self._dense_params_with_grad(group, grad_scale, found_inf)
        if not params:
            return
        with self._planned_step(group, params) as plan:
            state_sum, step = plan.state_capsules
            with kernel_range("adagrad_step"):
                _C.adagrad_step(
                    plan.param_capsules,
                    grad_capsules(params, grads),
                    state_sum,
                    step,
                    _C.AdagradOptions(
                        lr=float(group["lr"]),
                        lr_decay=float(group["lr_decay"]),
                        weight_decay=float(group["weight_decay"]),
                        eps=float(group["eps"]),
                        maximize=bool(group.get("maximize", False)),
                    ),
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                    bottoms=plan.bottom_capsules,
                )
