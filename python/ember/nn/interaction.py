"""DLRM's dot interaction as one operator: ``torch.ops.ember.interaction``.

``interaction(dense, *sparse)`` returns, per sample, the dense features followed by the pairwise dot products of
all the vectors (dense first, then each table's pooled embedding), strict lower triangle, row by row: DLRM's
``interact_features`` with ``arch_interaction_op="dot"`` and no self-interaction. torch's composite stacks the
vectors (a copy), multiplies the whole [B, T+1, T+1] product (twice the needed work), gathers the triangle and
concatenates again (two more copies); the kernel (csrc/interaction) reads each vector once and writes the row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember import _C
from ember._library import define, needs_input_grad, tracing
from ember._tensor import dlpack, require_tensor, sync_threads

__all__ = ["interaction"]


def _output_shape(inputs: list[torch.Tensor]) -> tuple[int, int]:
    """[batch, width + pairs] for inputs of one [batch, width] shape; ValueError naming the input that is not.
    (The kernel and the fake kernel both ask, so a compiled or meta call refuses what an eager one does.)"""
    if not inputs:
        raise ValueError("interaction: needs the dense tensor")
    if inputs[0].dim() != 2:
        raise ValueError(f"interaction: dense (inputs[0]) must be 2-D [batch, width], got {list(inputs[0].shape)}")
    for i, t in enumerate(inputs[1:], 1):
        if t.shape != inputs[0].shape:
            raise ValueError(f"interaction: inputs[{i}] must have the shape of inputs[0] (dense) "
                             f"{list(inputs[0].shape)}, got {list(t.shape)} (sparse[{i - 1}])")  # fmt: skip
    n, (batch, width) = len(inputs), inputs[0].shape
    return batch, width + n * (n - 1) // 2


def _forward_kernel(inputs: list[torch.Tensor]) -> torch.Tensor:
    batch, _ = _output_shape(inputs)
    x = [t.contiguous() for t in inputs]
    out = x[0].new_empty(batch, _C.interaction_output_width(len(x), x[0].shape[1]))
    sync_threads()
    _C.interaction_forward([dlpack(t) for t in x], dlpack(out))
    return out


def _forward_fake(inputs: list[torch.Tensor]) -> torch.Tensor:
    return inputs[0].new_empty(_output_shape(inputs))


def _backward_kernel(grad: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    x = [t.contiguous() for t in inputs]
    grads = [torch.empty_like(t) for t in x]
    sync_threads()
    _C.interaction_backward(
        [dlpack(t) for t in x], dlpack(grad.to(x[0].dtype).contiguous()), [dlpack(g) for g in grads]
    )
    return grads


def _backward_fake(grad: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in inputs]


_interaction_backward: Callable[..., list[torch.Tensor]] = define(
    "interaction_backward(Tensor grad, Tensor[] inputs) -> Tensor[]", _backward_kernel, fake=_backward_fake
)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.inputs = inputs[0]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    needs = needs_input_grad(ctx)[0]
    if not any(needs):
        return ([None] * len(ctx.inputs),)
    grads = _interaction_backward(grad, ctx.inputs)
    return ([g if needed else None for g, needed in zip(grads, needs)],)


_interaction: Callable[..., torch.Tensor] = define(
    "interaction(Tensor[] inputs) -> Tensor",
    _forward_kernel,
    fake=_forward_fake,
    backward=_backward,
    setup_context=_setup_context,
)


def interaction(dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
    """[B, D + (T+1) T / 2]: ``dense`` ([B, D]) beside the pairwise dots of ``dense`` and the T ``sparse`` vectors
    (each [B, D], typically a list of pooled embeddings unpacked with ``*``), float32 or bfloat16; float64 runs a
    scalar path in double (gradient checks, float64 references)."""
    if tracing(dense):
        return _interaction([dense, *sparse])
    tensors = [require_tensor("interaction", "dense", dense)]
    tensors += [require_tensor("interaction", f"sparse[{t}]", s) for t, s in enumerate(sparse)]
    return _interaction(tensors)
