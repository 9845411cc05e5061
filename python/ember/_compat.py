"""Every private torch name ember uses, in one place, each with what it is for and the torch versions that have it.

torch's private names change without notice; keeping them here makes a new torch a one-file review, and
tests/python/test_compat.py checks each of them on every torch the suite runs under (1.13 and 2.x). Nothing else in
the package reaches for an underscored torch attribute.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as _optimizer_module
from torch import nn

__all__ = [
    "attention_packs_in_proj",
    "autograd_below",
    "conv_reversed_padding",
    "draws_random_numbers",
    "interposed_dispatch",
    "is_compiling",
    "mark_optimizer_stepped",
    "mha_shape_check",
    "operator_schema",
    "optimizer_step_hooks",
    "profiler_enabled",
    "register_load_state_dict_pre_hook",
    "register_state_dict_hook",
    "size_hint",
    "tracing_state",
    "weight_norm_functions",
]


# Whether a torch.profiler (or autograd profiler) is recording now (every torch): torch's own C function, bound
# directly because every ember kernel call asks (ember._profiling).
profiler_enabled: Callable[[], bool] = torch.autograd._profiler_enabled  # type: ignore[attr-defined]


def tracing_state() -> Any:
    """torch.jit.trace's tracing state, or None when no trace is recording (every torch)."""
    return torch._C._get_tracing_state()


def interposed_dispatch() -> bool:
    """Whether anything stands between a call and the CPU kernels: a TorchDispatchMode or TorchFunctionMode (fake
    tensors, FlopCounter), functorch transforms (vmap, grad), the autograd profiler or a jit trace."""
    C: Any = torch._C
    return bool(
        C._len_torch_dispatch_stack()
        or C._len_torch_function_stack()
        or C._get_tracing_state() is not None
        or C._are_functorch_transforms_active()
        or profiler_enabled()
    )


def _dynamo_is_compiling() -> bool:
    # torch 2.0 to 2.2 spell it in torch._dynamo, which `torch._dynamo` would import on first touch (a second or so
    # at start-up); a process that never imported it is not compiling. torch 1.13 has no dynamo.
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and bool(dynamo.is_compiling())


# Whether torch.compile (dynamo) is tracing the calling code: torch.compiler.is_compiling from 2.3 on (dynamo treats
# it as a constant while it traces), resolved once because operators ask on every call.
is_compiling: Callable[[], bool] = (
    getattr(getattr(torch, "compiler", None), "is_compiling", None) or _dynamo_is_compiling
)


_UNTRACED: dict[Callable[..., Any], Callable[..., Any]] = {}


def untraced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a function, not a bound method), called as Python while torch.compile traces its caller: dynamo
    neither follows nor records it (the caller breaks the graph there). One wrapper per function, kept: a new one on
    every call would be a new object to dynamo each time, and recompile its caller until dynamo gives up. Asked
    for only while dynamo compiles, when ``torch._dynamo`` is imported already."""
    wrapper = _UNTRACED.get(fn)
    if wrapper is None:
        import torch._dynamo  # (here: a second or so at start-up, for a process that never compiles)

        wrapper = _UNTRACED[fn] = torch._dynamo.disable(fn)
    return wrapper


def autograd_below() -> Any:
    """A guard under which calls skip the Autograd dispatch key and reach the backend kernels (every torch; in 1.13
    an object to hold, not a context manager)."""
    return torch._C._AutoDispatchBelowAutograd()


Hooks = list[Callable[..., Any]]


def optimizer_step_hooks(optimizer: torch.optim.Optimizer) -> tuple[Hooks, Hooks] | None:
    """The step pre-hooks and post-hooks to run around ``optimizer.step``, in torch's order (the global ones of
    ``register_optimizer_step_pre_hook`` first, the optimizer's own ``register_step_pre_hook`` ones after, and the
    reverse for post-hooks), or None on torch 1.13, which has no step hooks."""
    own_pre = getattr(optimizer, "_optimizer_step_pre_hooks", None)
    if own_pre is None:
        return None
    own_post = optimizer._optimizer_step_post_hooks
    global_pre = getattr(_optimizer_module, "_global_optimizer_pre_hooks", {})
    global_post = getattr(_optimizer_module, "_global_optimizer_post_hooks", {})
    return [*global_pre.values(), *own_pre.values()], [*own_post.values(), *global_post.values()]


def mark_optimizer_stepped(optimizer: torch.optim.Optimizer) -> None:
    """Calls the hook torch.optim calls after every step (``_optimizer_step_code``, torch >= 2.0): the entry point
    torch.profiler's Python tracer watches to record the optimizer's parameters and state."""
    marker = getattr(optimizer, "_optimizer_step_code", None)
    if marker is not None:
        marker()


def register_state_dict_hook(module: nn.Module, hook: Callable[..., Any]) -> None:
    """Runs ``hook(module, state_dict, prefix, local_metadata)`` after ``module.state_dict()`` fills its entries
    (every torch from 1.13; the public ``register_state_dict_post_hook`` came in 2.x with other semantics)."""
    module._register_state_dict_hook(hook)


def register_load_state_dict_pre_hook(module: nn.Module, hook: Callable[..., Any]) -> None:
    """Runs ``hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors)`` before
    ``module.load_state_dict`` copies its entries (every torch from 1.13)."""
    module._register_load_state_dict_pre_hook(hook, with_module=True)


# torch.nn.functional's shape checks of MultiheadAttention's inputs (torch 1.13 to 2.x; None where absent).
mha_shape_check: Callable[..., Any] | None = getattr(torch.nn.functional, "_mha_shape_check", None)


def attention_packs_in_proj(module: nn.MultiheadAttention) -> bool:
    """Whether ``module`` keeps q, k and v projections in one ``in_proj_weight`` (every torch)."""
    return bool(module._qkv_same_embed_dim)


def conv_reversed_padding(module: nn.modules.conv._ConvNd) -> list[int]:
    """The padding of a convolution as ``F.pad`` takes it, last dimension first (every torch)."""
    return list(module._reversed_padding_repeated_twice)


def operator_schema(target: Any) -> Any:
    """The schema (argument names, defaults, returns) of an operator overload such as ``torch.ops.aten.linear.default``
    (what torch.export's graphs call) or ``torch.ops.ember.<name>.default``; None for any other object (every
    torch)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema
    return None


def draws_random_numbers(target: Any) -> bool:
    """Whether an operator overload may draw from a random generator (``aten.rand``, ``aten.bernoulli``), as its
    tags say (torch 2.x, whose graphs are the only ones holding overloads); True where torch has no tags."""
    tags = getattr(target, "tags", None)
    return tags is None or not hasattr(torch, "Tag") or torch.Tag.nondeterministic_seeded in tags


def size_hint(size: Any) -> int | None:
    """A size as a graph recorded it: an int as it is, a symbolic size (torch.export's, dynamo's dynamic shapes) as
    the example value it was traced with (``SymInt.node.hint``, torch 2.x), None where neither is known."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


# The function a weight norm's parametrization (and its hook) computes the weight with, as symbolic tracing and dynamo
# record it (torch._weight_norm, every torch from 1.13; empty where absent).
weight_norm_functions: tuple[Callable[..., Any], ...] = tuple(
    f for f in (getattr(torch, "_weight_norm", None),) if f is not None
)
