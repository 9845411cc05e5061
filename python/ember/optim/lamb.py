"""Lamb and LARS: layer-wise adaptive optimizers for large-batch training (torch.optim has neither)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember import _C
from ember.optim._base import (
    FusedOptimizer,
    adam_moments_row,
    check_adam_hyperparameters,
    check_finite,
    check_momentum_hyperparameters,
    grad_capsules,
)


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

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params = self._params_with_grad(group)
        if not params:
            return
        rows = [adam_moments_row(self.state[p], p) for p in params]
        columns, bottoms = self._group_capsules(group, params, rows)
        beta1, beta2 = group["betas"]
        _C.lamb_step(
            columns[0],
            grad_capsules(params),
            columns[1],
            columns[2],
            columns[3],
            lr=float(group["lr"]),
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            bias_correction=bool(group["bias_correction"]),
            maximize=bool(group["maximize"]),
            grad_scale=grad_scale,
            found_inf=found_inf,
            bottoms=bottoms,
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

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params = self._params_with_grad(group)
        if not params:
            return
        momentum = float(group["momentum"])
        rows, first_step = self._momentum_rows(params, momentum)
        columns, bottoms = self._group_capsules(group, params, rows)
        _C.lars_step(
            columns[0],
            grad_capsules(params),
            columns[1] if momentum != 0.0 else [],
            first_step,
            lr=float(group["lr"]),
            momentum=momentum,
            dampening=float(group["dampening"]),
            weight_decay=float(group["weight_decay"]),
            nesterov=bool(group["nesterov"]),
            trust_coefficient=float(group["trust_coefficient"]),
            eps=float(group["eps"]),
            maximize=bool(group["maximize"]),
            grad_scale=grad_scale,
            found_inf=found_inf,
            bottoms=bottoms,
        )
