"""Adam and AdamW, fused: drop-in replacements for torch.optim.Adam and torch.optim.AdamW."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import torch

from ember import _C
from ember._profiling import kernel_range
from ember.optim._base import FusedOptimizer
from ember.optim._hyperparameters import check_adam_hyperparameters
from ember.optim._plan import grad_capsules
from ember.optim._state import ADAM_STATE_KEYS, fp32_zeros_like, init_adam_state


class Adam(FusedOptimizer):
    r"""Adam (Kingma & Ba, 2015) with torch.optim.Adam's arguments, defaults, state and results.

    Per parameter, in torch.optim's order (``_single_tensor_adam``), with :math:`t` the parameter's step count:

    .. math::
        g &\leftarrow \pm\nabla \quad(\text{minus under } maximize),\qquad
        g \leftarrow g + \lambda\theta \;\text{(Adam)} \quad\text{or}\quad \theta \leftarrow \theta(1-\gamma\lambda)
        \;\text{(AdamW)} \\
        m &\leftarrow m + (1-\beta_1)(g - m),\qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2,\qquad
        \hat v = \max(\hat v, v) \;\text{(amsgrad)} \\
        \theta &\leftarrow \theta - \frac{\gamma}{1-\beta_1^t}\,
        \frac{m}{\sqrt{\hat v}/\sqrt{1-\beta_2^t} + \epsilon}

    The whole group is updated in one parallel pass over memory (28 bytes per fp32 parameter, 36 with amsgrad).
    ``foreach`` and ``fused`` are accepted for compatibility and ignored (ember's step is always fused);
    ``capturable`` and ``differentiable`` raise NotImplementedError. Sparse gradients raise RuntimeError, as in
    torch. Parameters are float32, bfloat16 or split-BF16 CPU tensors (see :class:`~ember.optim.FusedOptimizer`),
    and the moments are float32 for all. A bf16 parameter (with its bf16 gradient) is widened, updated in fp32 and
    rounded back to nearest even, in the same pass (22 bytes per parameter); a split-BF16 one is joined, updated
    and split exactly (26 bytes). torch.optim would keep bf16 moments for a bf16 parameter: loading ember's
    checkpoint into it casts them, and loading torch's into ember widens them.
    """

    _torch_class: type | None = torch.optim.Adam
    _decoupled_by_default = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        self._init(params, locals())

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        check_adam_hyperparameters(group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return _AMSGRAD_KEYS if group["amsgrad"] else ADAM_STATE_KEYS

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        init_adam_state(p, state)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:  # new, or amsgrad switched on after training began
            state["max_exp_avg_sq"] = fp32_zeros_like(p)

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        params, grads = self._params_with_grad(group)
        if not params:
            return
        amsgrad = bool(group["amsgrad"])
        beta1, beta2 = group["betas"]
        with self._planned_step(group, params) as plan:
            exp_avg, exp_avg_sq, step, *max_exp_avg_sq = plan.state_capsules
            with kernel_range("adam_step"):
                _C.adam_step(
                    plan.param_capsules,
                    grad_capsules(params, grads),
                    exp_avg,
                    exp_avg_sq,
                    max_exp_avg_sq[0] if amsgrad else [],
                    step,
                    _C.AdamOptions(
                        lr=float(group["lr"]),
                        beta1=float(beta1),
                        beta2=float(beta2),
                        eps=float(group["eps"]),
                        weight_decay=float(group["weight_decay"]),
                        decoupled_weight_decay=bool(group.get("decoupled_weight_decay", self._decoupled_by_default)),
                        amsgrad=amsgrad,
                        maximize=bool(group.get("maximize", False)),
                    ),
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                    bottoms=plan.bottom_capsules,
                )


_AMSGRAD_KEYS = (*ADAM_STATE_KEYS, "max_exp_avg_sq")


class AdamW(Adam):
    r"""AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay, :math:`\theta \leftarrow
    \theta(1 - \gamma\lambda)` before the update, with torch.optim.AdamW's arguments (weight_decay defaults to
    1e-2), state and results. See :class:`Adam` for the rest."""

    _torch_class = torch.optim.AdamW
    _decoupled_by_default = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        self._init(params, locals())
