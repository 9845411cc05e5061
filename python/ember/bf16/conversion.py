"""The bf16 conversions themselves (``split``, ``join``, ``round``): argument checks, output allocation and the
call into ember's kernels. ``ember.bf16`` re-exports them; its docstring says what they compute."""

from __future__ import annotations

import torch

from ember import _C
from ember._profiling import kernel_range
from ember._tensor import dlpack, memory_order, require_tensor, sync_threads

__all__ = ["join", "round", "split"]


def split(
    x: torch.Tensor, *, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Splits a float32 tensor into its bf16 top half and its int16 bottom half.

    Args:
        x: float32 CPU tensor.
        out: optional ``(top, bottom)`` to write into: bfloat16 and int16, contiguous, of ``x``'s shape.

    Returns:
        ``(top, bottom)`` with ``join(top, bottom)`` equal to ``x`` bit for bit.
    """
    x = _require_dtype("bf16.split", "x", x, torch.float32)
    if out is None:
        x, order = _dense(x)
        top = torch.empty_like(x, dtype=torch.bfloat16, memory_format=torch.preserve_format)
        bottom = torch.empty_like(x, dtype=torch.int16, memory_format=torch.preserve_format)
    else:
        x, order = x.contiguous(), None
        top, bottom = _pair("bf16.split", out)
    sync_threads()
    with kernel_range("bf16_split"):
        _C.bf16_split(dlpack(_permute(x, order)), dlpack(_permute(top, order)), dlpack(_permute(bottom, order)))
    return top, bottom


def join(top: torch.Tensor, bottom: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Joins a bf16 top half and an int16 bottom half back into float32.

    Args:
        top: bfloat16 CPU tensor (from :func:`split`).
        bottom: int16 CPU tensor of the same shape.
        out: optional float32 contiguous tensor of that shape to write into.

    Returns:
        The float32 tensor whose bit patterns are ``top << 16 | bottom``.
    """
    top = _require_dtype("bf16.join", "top", top, torch.bfloat16)
    bottom = _require_dtype("bf16.join", "bottom", bottom, torch.int16)
    order = None
    if out is None and top.shape == bottom.shape and top.stride() == bottom.stride():
        top, order = _dense(top)
        bottom = bottom if order is not None else bottom.contiguous()
        out = torch.empty_like(top, dtype=torch.float32, memory_format=torch.preserve_format)
    else:
        top, bottom = top.contiguous(), bottom.contiguous()
        out = _output("bf16.join", out, top.shape, torch.float32)
    sync_threads()
    with kernel_range("bf16_join"):
        _C.bf16_join(dlpack(_permute(top, order)), dlpack(_permute(bottom, order)), dlpack(_permute(out, order)))
    return out


def round(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:  # noqa: A001 - the natural name
    """Rounds a float32 tensor to bfloat16, to nearest even; NaN stays NaN.

    Args:
        x: float32 CPU tensor.
        out: optional bfloat16 contiguous tensor of ``x``'s shape to write into.

    Returns:
        The bfloat16 tensor.
    """
    x = _require_dtype("bf16.round", "x", x, torch.float32).contiguous()
    out = _output("bf16.round", out, x.shape, torch.bfloat16)
    sync_threads()
    with kernel_range("bf16_round"):
        _C.bf16_round(dlpack(x), dlpack(out))
    return out


def _require_dtype(op: str, name: str, x: object, dtype: torch.dtype) -> torch.Tensor:
    """``x`` if it is a tensor of ``dtype``, else a TypeError naming op and argument. (The core checks dtypes too,
    but torch 1.13 cannot even export a bool tensor through DLPack, and says so without naming anything.)"""
    x = require_tensor(op, name, x)
    if x.dtype != dtype:
        want, got = (str(d).replace("torch.", "") for d in (dtype, x.dtype))
        raise TypeError(f"{op}: {name} must have dtype {want}, got {got}")  # the core's words
    return x


def _dense(x: torch.Tensor) -> tuple[torch.Tensor, list[int] | None]:
    """``x`` and the order of its dimensions under which it is contiguous (None: contiguous as it is; an ``x``
    with gaps or overlaps is copied to a contiguous tensor)."""
    order = memory_order(x)
    return (x, order) if order is not None else (x.contiguous(), None)


def _permute(x: torch.Tensor, order: list[int] | None) -> torch.Tensor:
    return x if order is None else x.permute(order)


def _output(op: str, out: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A new output tensor, or the caller's (whose dtype, shape and layout the kernel's checks judge)."""
    return torch.empty(shape, dtype=dtype) if out is None else require_tensor(op, "out", out)


def _pair(op: str, out: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"{op}: out must be a (top, bottom) pair of tensors, got {type(out).__name__}")
    return require_tensor(op, "out[0]", out[0]), require_tensor(op, "out[1]", out[1])
