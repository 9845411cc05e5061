"""ember's operators in torch's dispatcher: ``torch.ops.ember.<name>``, one registration helper for every torch.

An operator registered here is one node to ``torch.fx`` tracing and to ``torch.compile`` (no graph break), has a
fake kernel that computes output shapes without data where the torch version knows fake tensors (2.2 and later;
a Meta kernel on older ones), and its own autograd formula. The kernels are Python functions that hand the tensors
to ``ember._C`` through DLPack; the C++ core never links libtorch (docs/architecture.md), so this module is the one
place that knows how each torch version spells a registration:

- torch >= 2.4: ``torch.library.register_fake`` and ``torch.library.register_autograd``;
- older (1.13 to 2.3): a Meta kernel, and an Autograd kernel that runs a ``torch.autograd.Function`` whose forward
  redispatches below autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.library import Library

from ember._compat import autograd_below, interposed_dispatch, is_compiling, operator_schema

__all__ = ["define", "dispatcher_needed", "needs_input_grad", "tracing"]

_NAMESPACE = "ember"
_library = Library(_NAMESPACE, "DEF")
_MODERN = hasattr(torch.library, "register_fake") and hasattr(torch.library, "register_autograd")


def define(
    schema: str,
    kernel: Callable[..., Any],
    *,
    fake: Callable[..., Any],
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[[Any, tuple[Any, ...], Any], None] | None = None,
) -> Any:
    """Defines ``torch.ops.ember.<name>`` from its schema (``"name(Tensor x, ...) -> Tensor"``) and returns it.

    ``kernel`` runs on CPU tensors; ``fake`` gets fake (or meta) tensors and returns outputs of the right shapes and
    dtypes. ``backward(ctx, *grads)`` and ``setup_context(ctx, inputs, output)`` follow
    ``torch.library.register_autograd``: setup_context saves what backward needs on ctx, backward returns one
    gradient (or None) per input, a list for a list input; ``needs_input_grad(ctx)`` says which are wanted, in the
    inputs' structure.
    Without them the operator has no gradient (an error if one is asked for).
    """
    name = schema.split("(", 1)[0]
    _library.define(schema)
    qualified = f"{_NAMESPACE}::{name}"
    op = getattr(getattr(torch.ops, _NAMESPACE), name)
    fake = _same_device(name, [a.name for a in operator_schema(op.default).arguments], fake)
    _library.impl(name, _naming_dlpack_errors(name, kernel), "CPU")
    if _MODERN:
        torch.library.register_fake(qualified, fake, lib=_library)
    else:
        _library.impl(name, fake, "Meta")
    if backward is not None:
        if setup_context is None:
            raise TypeError(f"define({name}): backward needs setup_context")
        if _MODERN:
            torch.library.register_autograd(qualified, backward, setup_context=setup_context, lib=_library)
        else:
            _library.impl(name, _autograd_kernel(op, backward, setup_context), "Autograd")
    return op


def _naming_dlpack_errors(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` with torch's DLPack export errors (torch 1.13 cannot export bool tensors: "Bool type is not
    supported by dlpack") raised as a TypeError that names the operator. (A try block costs nothing until it
    raises.)"""

    def run(*args: Any) -> Any:
        try:
            return kernel(*args)
        except RuntimeError as error:
            if "dlpack" not in str(error).lower():
                raise
            raise TypeError(f"ember.{name}: a tensor of an unsupported dtype: {error}") from None

    return run


def _same_device(name: str, arg_names: list[str], fake: Callable[..., Any]) -> Callable[..., Any]:
    """``fake`` behind torch's device rule. The dispatcher sends a call with any ``meta`` tensor to the fake kernel,
    CPU tensors beside it or not; the fake kernel would then return outputs without data, on whatever device it
    copies, where torch's own operators refuse the mix. So: all tensors on one device (all meta, or all fake CPU
    tensors under torch.compile), else torch's RuntimeError naming the first argument on another device."""

    def checked(*args: Any) -> Any:
        first: tuple[str, torch.device] | None = None
        for arg_name, value in zip(arg_names, args):
            items = value if isinstance(value, (list, tuple)) else (value,)
            for i, t in enumerate(items):
                if not isinstance(t, torch.Tensor):
                    continue
                label = f"{arg_name}[{i}]" if items is value else arg_name
                if first is None:
                    first = (label, t.device)
                elif t.device != first[1]:
                    raise RuntimeError(
                        f"ember.{name}: expected all tensors to be on the same device, but found at least two "
                        f"devices, {first[1]} ({first[0]}) and {t.device} ({label})"
                    )
        return fake(*args)

    return checked


def needs_input_grad(ctx: Any) -> tuple[Any, ...]:
    """Which inputs of an operator's backward want a gradient, shaped like the inputs (a list of bools for a list).

    register_autograd gives ctx.needs_input_grad that shape; older torch cannot reassign it, so the legacy kernel
    keeps its own copy.
    """
    needs: tuple[Any, ...] = getattr(ctx, "structured_needs_input_grad", None) or ctx.needs_input_grad
    return needs


def tracing(*values: object) -> bool:
    """True under torch.fx symbolic tracing (a value is a Proxy). A functional wrapper then calls its operator as
    given, skipping its Python-side checks and normalization: shapes and dtypes are unknown, and the graph should
    hold the one operator."""
    return any(isinstance(v, torch.fx.Proxy) for v in values)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def dispatcher_needed(wanting_grad: list[torch.Tensor], others: list[torch.Tensor]) -> bool:
    """False when calling an operator's CPU kernel function directly gives exactly what ``torch.ops.ember.<name>``
    would: plain CPU tensors, no gradient wanted for ``wanting_grad`` (the float inputs), and nothing that watches or
    transforms dispatch (torch.compile or dynamo, jit or fx tracing, a dispatch or function mode such as fake
    tensors, functorch transforms, the profiler). The operator's own wrapper then skips torch's dispatcher.

    Why: a call through the dispatcher converts every argument to and from its C++ form and, under
    register_autograd, runs a Python autograd wrapper even when nothing wants a gradient; for the 104 tensors of a
    26-table lookup that was tens of microseconds a call (0.1 ms on the Xeon), a tenth of a small-batch forward.
    """
    if is_compiling() or (torch.is_grad_enabled() and any(t.requires_grad for t in wanting_grad)):
        return True
    if interposed_dispatch():
        return True
    return any(type(t) not in _PLAIN or not t.is_cpu for group in (wanting_grad, others) for t in group)


def _autograd_kernel(op: Any, backward: Callable[..., Any], setup_context: Callable[..., None]) -> Callable[..., Any]:
    """The Autograd-key kernel of ``op`` for torch versions without ``register_autograd``.

    ``torch.autograd.Function`` tracks only the tensors passed to it directly, so list arguments (``Tensor[]``,
    ``Tensor?[]``) travel flattened and are rebuilt on both sides; backward sees the structure the schema has.
    """
    list_output = _returns_list(op)

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, layout: tuple[int, ...], *flat: Any) -> Any:
            inputs = _unflatten(layout, flat)
            # Below autograd the call reaches the CPU (or Meta) kernel; torch 1.13's guard is no context manager,
            # so it lives for the duration of this frame.
            guard = autograd_below()
            try:
                output = op(*inputs)
            finally:
                del guard
            ctx.layout = layout
            setup_context(ctx, tuple(inputs), output)
            return tuple(output) if list_output else output

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            ctx.structured_needs_input_grad = tuple(_unflatten(ctx.layout, ctx.needs_input_grad[1:]))
            grad_inputs = backward(ctx, list(grads)) if list_output else backward(ctx, *grads)
            if not isinstance(grad_inputs, tuple):
                grad_inputs = (grad_inputs,)
            return (None, *_flatten(ctx.layout, grad_inputs))

    def kernel(*inputs: Any) -> Any:
        layout = tuple(len(x) if isinstance(x, (list, tuple)) else -1 for x in inputs)
        output = _Function.apply(layout, *_flatten(layout, inputs))  # type: ignore[no-untyped-call]
        return list(output) if list_output else output

    return kernel


def _flatten(layout: tuple[int, ...], values: tuple[Any, ...]) -> list[Any]:
    """The values with each list argument (layout[i] >= 0: its length) spliced in; None stands for a missing list."""
    flat: list[Any] = []
    for length, value in zip(layout, values):
        if length < 0:
            flat.append(value)
        else:
            flat.extend(value if value is not None else [None] * length)
    return flat


def _unflatten(layout: tuple[int, ...], flat: tuple[Any, ...]) -> list[Any]:
    values: list[Any] = []
    at = 0
    for length in layout:
        if length < 0:
            values.append(flat[at])
            at += 1
        else:
            values.append(list(flat[at : at + length]))
            at += length
    return values


def _returns_list(op: Any) -> bool:
    """True when the operator's (single) return is a Tensor[]."""
    returns = operator_schema(op.default).returns
    return len(returns) == 1 and str(returns[0].type) == "List[Tensor]"
