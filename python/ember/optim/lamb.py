"""Lamb and LARS: layer-wise adaptive optimizers for large-batch training (torch.optim has neither)."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import torch

from ember import _C
from ember._profiling import kernel_range
from ember.optim._base import FusedOptimizer
from ember.optim._hyperparameters import check_adam_hyperparameters, check_finite, check_momentum_hyperparameters
from ember.optim._plan import grad_capsules
from ember.optim._state import ADAM_STATE_KEYS, init_adam_state, init_momentum_state, momentum_state_keys


class Lamb(FusedOptimizer):
    r"""Lamb: Adam's direction scaled per tensor by the ratio of the weight norm to the update norm.

    You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes" (ICLR 2020), in the form
    of NVIDIA's FusedLAMB and Intel's IPEX Lamb. Per tensor, with :math:`t` its step count:

    .. math::
        m &\leftarrow m + (1-\beta_1)(g - m),\qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
        u &= \frac{m / (1-\beta_1^t)}{\sqrt{v / (1-\beta_2^t)} + \epsilon} + \lambda\theta
            \quad(\text{no bias correction when } bias\_correction=False) \\
        \theta &\leftarrow \theta - \gamma\, r\, u,\qquad
        r = \frac{\lVert\theta\rVert}{\lVert u\rVert} \text{ if both norms are non-zero, else } 1

    The norms are computed over fixed-size blocks whose partial sums are added in order, so results are
    identical for any thread count; the gradients are never written. State (``exp_avg``, ``exp_avg_sq``, ``step``)
    is laid out as torch.optim.Adam's, in float32. Parameters are float32, bfloat16 or split-BF16 CPU tensors
    (see :class:`~ember.optim.FusedOptimizer`); the norms are those of the fp32 values the step works on.
    """

    _torch_class = None

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        *,
        maximize: bool = False,
    ) -> None:
        self._init(params, locals())

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        check_adam_hyperparameters(group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ADAM_STATE_KEYS

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        init_adam_state(p, state)

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params, grads = self._params_with_grad(group)
        if not params:
            return
        beta1, beta2 = group["betas"]
        with self._planned_step(group, params) as plan:
            exp_avg, exp_avg_sq, step = plan.state_capsules
            with kernel_range("lamb_step"):
                _C.lamb_step(
                    plan.param_capsules,
                    grad_capsules(params, grads),
                    exp_avg,
                    exp_avg_sq,
                    step,
                    _C.LambOptions(
                        lr=float(group["lr"]),
                        beta1=float(beta1),
                        beta2=float(beta2),
                        eps=float(group["eps"]),
                        weight_decay=float(group["weight_decay"]),
                        bias_correction=bool(group["bias_correction"]),
                        maximize=bool(group["maximize"]),
                    ),
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                    bottoms=plan.bottom_capsules,
                )


class LARS(FusedOptimizer):
    r"""LARS: SGD with momentum whose step is scaled per tensor by a trust ratio of weight and gradient norms.

    You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks" (2017), in the form used by SimCLR
    and Lightning Bolts. Per tensor:

    .. math::
        r &= \eta\,\frac{\lVert\theta\rVert}{\lVert g\rVert + \lambda\lVert\theta\rVert + \epsilon}
            \text{ if both norms are non-zero, else } 1,\qquad d = r\,(g + \lambda\theta) \\
        b &\leftarrow d \text{ (first step)},\quad b \leftarrow \mu b + (1-\tau) d,\qquad
        d \leftarrow d + \mu b \text{ (nesterov) or } b,\qquad \theta \leftarrow \theta - \gamma d

    (:math:`\eta` is ``trust_coefficient``, :math:`\tau` ``dampening``). Norms as in :class:`Lamb`: deterministic,
    the gradients never written. State (``momentum_buffer``) is laid out as torch.optim.SGD's, in float32.
    Parameters are float32, bfloat16 or split-BF16 CPU tensors (see :class:`~ember.optim.FusedOptimizer`).
    """

    _torch_class = None

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.9,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        trust_coefficient: float = 1e-3,
        eps: float = 1e-8,
        *,
        maximize: bool = False,
    ) -> None:
        self._init(params, locals())

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        check_momentum_hyperparameters(group)
        check_finite("trust_coefficient", group["trust_coefficient"], low=0.0)
        check_finite("epsilon", group["eps"], low=0.0)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return momentum_state_keys(group)

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        if group["momentum"] != 0:
            init_momentum_state(p, state)

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params, grads = self._params_with_grad(group)
        if not params:
            return
        momentum = float(group["momentum"])
        with self._planned_step(group, params) as plan, kernel_range("lars_step"):
            _C.lars_step(
                plan.param_capsules,
                grad_capsules(params, grads),
                plan.state_capsules[0] if momentum != 0.0 else [],
                plan.fresh("momentum_buffer") if momentum != 0.0 else [],
                _C.LarsOptions(
                    lr=float(group["lr"]),
                    momentum=momentum,
                    dampening=float(group["dampening"]),
                    weight_decay=float(group["weight_decay"]),
                    nesterov=bool(group["nesterov"]),
                    trust_coefficient=float(group["trust_coefficient"]),
                    eps=float(group["eps"]),
                    maximize=bool(group["maximize"]),
                ),
                grad_scale=grad_scale,
                found_inf=found_inf,
                bottoms=plan.bottom_capsules,
            )
