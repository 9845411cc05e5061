"""Turning a torch.optim optimizer into ember's fused one of the same kind, keeping everything that refers to it.

ember's optimizers subclass torch.optim.Optimizer with the same param-group keys, state layout and hooks as the
torch class they replace, so the torch object is converted in place by changing its class: its param groups
(hyper-parameters included), state, step hooks, and the LR schedulers and GradScalers already bound to it all
carry over, nothing is copied, and the object the user holds is the fused optimizer. Only exact torch classes are
converted; a subclass may override ``step`` with other math, so it is refused, as are optimizers ember has no
kernel for.

An LR scheduler bound to the optimizer has replaced ``optimizer.step`` by an instance attribute: torch's wrapper
(``patch_track_step_called`` in torch 2.x, ``with_counter`` in 1.13) that counts calls and then calls the function
it captured, the torch class's ``step``. That captured function is pointed at ember's ``step``, so the scheduler
keeps counting and the fused step runs. Any other instance-level ``step`` is refused with advice.
"""

from __future__ import annotations

from typing import Any

import torch

from ember import optim as ember_optim

FUSED_REPLACEMENTS: dict[type, type[ember_optim.FusedOptimizer]] = {
    torch.optim.SGD: ember_optim.SGD,
    torch.optim.Adam: ember_optim.Adam,
    torch.optim.AdamW: ember_optim.AdamW,
    torch.optim.Adagrad: ember_optim.Adagrad,
}


def fused_class_for(optimizer: torch.optim.Optimizer) -> type[ember_optim.FusedOptimizer] | None:
    """The ember class ``optimizer`` becomes (None: it is one already), or a clear error if there is none."""
    if isinstance(optimizer, ember_optim.FusedOptimizer):
        return None
    replacement = FUSED_REPLACEMENTS.get(type(optimizer))
    if replacement is None:
        names = ", ".join(f"torch.optim.{cls.__name__}" for cls in FUSED_REPLACEMENTS)
        raise NotImplementedError(
            f"ember.optimize: no fused replacement for {type(optimizer).__module__}.{type(optimizer).__qualname__}; "
            f"ember fuses {names} and its own ember.optim classes (Lamb, LARS too). Pass one of those, or call "
            "ember.optimize without optimizer= (and without bf16 weights) to keep yours"
        )
    return replacement


def check_convertible(optimizer: torch.optim.Optimizer, replacement: type[ember_optim.FusedOptimizer]) -> None:
    """Raises, before anything changes, if ``optimizer``'s groups hold what the fused class refuses."""
    for index, group in enumerate(optimizer.param_groups):
        for key in ("capturable", "differentiable"):
            if group.get(key):
                raise NotImplementedError(
                    f"ember.optimize: param_groups[{index}] has {key}=True, which ember's fused "
                    f"{replacement.__name__} does not support"
                )
        replacement._check_hyperparameters(optimizer, group)  # type: ignore[arg-type]
        for i, p in enumerate(group["params"]):
            if p.device.type != "cpu" or p.dtype not in replacement._param_dtypes:
                raise TypeError(
                    f"ember.optimize: param_groups[{index}]['params'][{i}] is a {p.dtype} tensor on {p.device}; "
                    f"ember's {replacement.__name__} takes float32 or bfloat16 CPU parameters"
                )
    _captured_step_cell(optimizer)


def make_fused(optimizer: torch.optim.Optimizer, replacement: type[ember_optim.FusedOptimizer]) -> None:
    """Converts ``optimizer`` to ``replacement`` in place (see the module docstring)."""
    cell = _captured_step_cell(optimizer)
    optimizer.__class__ = replacement
    if cell is not None:
        cell.cell_contents = replacement.step
        optimizer.__dict__["step"].__wrapped__ = replacement.step


def _captured_step_cell(optimizer: torch.optim.Optimizer) -> Any:
    """The closure cell in which an LR scheduler's ``step`` wrapper holds the class's step function; None when
    ``step`` is not replaced. Raises for an instance-level ``step`` of another kind."""
    wrapper = optimizer.__dict__.get("step")
    if wrapper is None:
        return None
    code = getattr(wrapper, "__code__", None)
    cells = getattr(wrapper, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars if code is not None else (), cells):
        if name == "func" and cell.cell_contents is getattr(type(optimizer), "step", None):
            return cell
    raise NotImplementedError(
        f"ember.optimize: optimizer.step is replaced by an instance attribute ({wrapper!r}) that ember does not "
        "know how to keep; create LR schedulers and step wrappers after ember.optimize"
    )
