"""A model's forward under ``torch.autocast("cpu", dtype)``, so that an optimized model takes fp32 inputs as is.

ember's bf16 parameters need bf16 activations, and the ops ember does not own should follow torch's autocast
rules (softmax, losses and norms in fp32, matmuls and convolutions in bf16). Running the top-level forward under
autocast does both, and nests harmlessly inside a user's own ``torch.autocast`` block (the IPEX way of writing the
loop). It is installed as an instance attribute, which ``nn.Module.__call__`` (and so DDP) calls instead of the
class's ``forward``; the attribute is a plain picklable object, so ``copy.deepcopy`` and ``torch.save`` of the
whole model keep working.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn


class _AutocastPool(threading.local):
    """Each thread's ``torch.autocast`` objects that are not in use, by their arguments.

    Building a ``torch.autocast`` costs on every forward: 0.8 µs under torch 2.13, and 24 µs under torch 1.13,
    whose constructor looks for torch_xla on disk every time. Entering and leaving one is cheaper (1.4 and 0.4
    µs), so the forwards below reuse them. An object stores the state it restores in itself, so one is never in
    use twice at once: each thread takes its own, and a nested call (a model inside a model) takes another.
    """

    def __init__(self) -> None:
        self.free: dict[tuple[torch.dtype | None, bool, bool], list[torch.autocast]] = {}

    def take(self, dtype: torch.dtype | None, enabled: bool) -> tuple[list[torch.autocast], torch.autocast]:
        """An autocast object for the CPU with these arguments, and the list to give it back to. Built with the
        current autocast cache setting (which ``torch.autocast`` reads when built), as a new one would be."""
        key = (dtype, enabled, torch.is_autocast_cache_enabled())
        free = self.free.get(key)
        if free is None:
            free = self.free[key] = []
        if free:
            return free, free.pop()
        return free, torch.autocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=key[2])


_pool = _AutocastPool()


def _call_under_autocast(
    dtype: torch.dtype | None, enabled: bool, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fn(*args, **kwargs)`` under ``torch.autocast("cpu", dtype=dtype, enabled=enabled)``, on a pooled object."""
    free, autocast = _pool.take(dtype, enabled)
    try:
        with autocast:
            return fn(*args, **kwargs)
    finally:
        free.append(autocast)


class AutocastForward:
    """Calls ``type(module).forward(module, ...)`` under CPU autocast to ``dtype``, or ``inner(...)``: the forward
    ember's inference rewrite installed on the same module (a fused Sequential that is the whole model)."""

    _ember_forward = True

    def __init__(self, module: nn.Module, dtype: torch.dtype, inner: Any = None) -> None:
        self.module = module
        self.dtype = dtype
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.inner is not None:
            return _call_under_autocast(self.dtype, True, self.inner, args, kwargs)
        return _call_under_autocast(self.dtype, True, type(self.module).forward, (self.module, *args), kwargs)

    def __repr__(self) -> str:
        return f"AutocastForward({type(self.module).__name__}, dtype={self.dtype})"


class Float32Forward:
    """Calls ``type(module).forward(module, ...)`` with autocast off and floating inputs in float32: for layers
    that stay fp32 because the running torch cannot run them in bf16 on this CPU, and that autocast would
    otherwise send to the same bf16 kernel (torch 2.x's CPU autocast runs LSTMs through oneDNN in bf16)."""

    _ember_forward = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward_args = (self.module, *_float32(args))
        return _call_under_autocast(None, False, type(self.module).forward, forward_args, _float32(kwargs))

    def __repr__(self) -> str:
        return f"Float32Forward({type(self.module).__name__})"


def _float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    return value


def install_float32_forward(module: nn.Module) -> None:
    """Makes ``module`` run in float32 with autocast off (see :class:`Float32Forward`)."""
    if not isinstance(module.__dict__.get("forward"), Float32Forward):
        module.__dict__["forward"] = Float32Forward(module)


def check_forward_replaceable(model: nn.Module) -> None:
    """Raises if ``model.forward`` is an instance attribute other than ember's own forwards (which it would hide).
    Every forward ember installs has the class attribute ``_ember_forward``."""
    existing = model.__dict__.get("forward")
    if existing is not None and not getattr(existing, "_ember_forward", False):
        raise ValueError(
            "ember.optimize: model.forward is replaced by an instance attribute "
            f"({type(existing).__name__}); call ember.optimize before wrapping the forward"
        )


def install_autocast_forward(model: nn.Module, dtype: torch.dtype, inner: Any = None) -> None:
    """Makes ``model``'s forward (or ``inner``, see :class:`AutocastForward`) run under CPU autocast to ``dtype``
    (replacing an earlier ember wrapper; a model that is itself a layer running in fp32 with autocast off keeps
    that). :func:`check_forward_replaceable` first."""
    if not isinstance(model.__dict__.get("forward"), Float32Forward):
        model.__dict__["forward"] = AutocastForward(model, dtype, inner)
