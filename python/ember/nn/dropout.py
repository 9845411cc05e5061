"""Dropout on ember's counter-based generator.

Whether an element is dropped is a function of a seed and the element's position (Philox4x32-10; see
csrc/include/ember/dropout.h), so the kernel runs on every core and vector lane at once, and backward regenerates
the mask from the seed instead of keeping it: nothing but the seed is saved between forward and backward (torch
keeps a mask of the input's size and dtype per dropout). torch's CPU dropout draws its mask serially from one
Mersenne Twister, about 15 ns an element; this is what made it 60% of a BERT-base training step.

The seed of each call is drawn from torch's default generator, so ``torch.manual_seed`` makes runs repeatable
and ``torch.utils.checkpoint`` (which restores the generator before recomputing) recomputes the same mask. The
masks are not torch's: the same seed gives other elements dropped than ``torch.nn.functional.dropout`` would.

float32 and bfloat16 CPU tensors run on the kernel; other dtypes and devices go to torch's dropout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ember import _C
from ember._profiling import kernel_range
from ember._tensor import dlpack, memory_order, sync_threads

__all__ = ["Dropout", "dropout"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_SEED_LOW, _SEED_HIGH = -(2**63), 2**63 - 1


def dropout(
    input: torch.Tensor,  # noqa: A002 - torch's name for it
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.dropout``: zeroes each element with probability ``p`` and scales the
    rest by ``1 / (1 - p)``; ``input`` itself when not training.

    Autograd records it like torch's (in place too); backward regenerates the mask from the call's seed.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"dropout: input must be a torch.Tensor, got {type(input).__name__}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training:
        return input
    if input.dtype not in _KERNEL_DTYPES or input.device.type != "cpu" or input.layout != torch.strided:
        return F.dropout(input, p, training, inplace)
    out: torch.Tensor = _Dropout.apply(input, float(p), _draw_seed(), inplace)  # type: ignore[no-untyped-call]
    return out


class Dropout(torch.nn.Dropout):
    """``torch.nn.Dropout`` on ember's kernel: same arguments, same state (none), same ``repr``.

    ``ember.optimize`` turns a model's ``nn.Dropout`` modules into this class for training; a checkpoint does not
    see the difference.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        return dropout(input, self.p, self.training, self.inplace)


def _draw_seed() -> int:
    """64 random bits from torch's default generator, as the kernel's unsigned seed."""
    return int(torch.randint(_SEED_LOW, _SEED_HIGH, (), dtype=torch.int64).item()) & 0xFFFF_FFFF_FFFF_FFFF


class _Dropout(torch.autograd.Function):
    """y = dropout(x) under (p, seed); its gradient is the same function of the incoming gradient, so backward
    applies this Function again (double backward works the same way)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float, seed: int, inplace: bool) -> torch.Tensor:
        dense = x if _is_dense(x) else x.contiguous()
        out = dense if inplace else torch.empty_like(dense)  # a dense tensor's empty_like keeps its strides
        sync_threads()
        with kernel_range("dropout"):
            _C.dropout(dlpack(dense), dlpack(out), p, seed)
        if inplace:
            if dense is not x:
                x.copy_(dense)
            ctx.mark_dirty(x)
            out = x
        ctx.p, ctx.seed, ctx.strides = p, seed, dense.stride()
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # The mask is laid over memory order: the gradient must be in the order the input was.
        if grad.stride() != ctx.strides:
            grad = torch.empty_strided(grad.shape, ctx.strides, dtype=grad.dtype).copy_(grad)
        grad_x: torch.Tensor = _Dropout.apply(grad, ctx.p, ctx.seed, False)  # type: ignore[no-untyped-call]
        return grad_x, None, None, None


def _is_dense(x: torch.Tensor) -> bool:
    """Every element once, no gaps, in some order of the dimensions (contiguous, channels-last, transposed)."""
    return x.is_contiguous() or memory_order(x) is not None
