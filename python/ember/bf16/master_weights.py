"""Split-BF16 master weights: an fp32 parameter stored as its bf16 top half (the parameter's data, which the model
computes with) and an int16 bottom half kept in a ``bottoms`` dict (parameter -> bottom half) that an optimizer
holds beside its state and steps with its fused kernels. These functions are every move between the two forms;
``ember.optim.FusedOptimizer``'s master-weight methods and ``ember.optimize`` call them.
"""

from __future__ import annotations

import torch

from ember.bf16.conversion import join, split

Bottoms = dict[torch.Tensor, torch.Tensor]  # split parameter -> its int16 bottom half


@torch.no_grad()
def split_parameter(p: torch.Tensor, bottoms: Bottoms) -> None:
    """Makes float32 parameter ``p`` split-BF16 in place: its data becomes the bf16 top half (same memory layout),
    ``bottoms[p]`` the int16 bottom half, and a gradient already present bfloat16."""
    top, bottom = split(p.detach())
    p.data = top
    bottoms[p] = bottom
    if p.grad is not None:
        p.grad = p.grad.to(torch.bfloat16)


@torch.no_grad()
def join_parameter(p: torch.Tensor, bottoms: Bottoms) -> None:
    """The inverse of :func:`split_parameter`: ``p`` becomes float32 again, holding its exact master value (and its
    gradient float32); a parameter not in ``bottoms`` is left alone."""
    bottom = bottoms.pop(p, None)
    if bottom is None:
        return
    p.data = join(p.detach(), bottom)
    if p.grad is not None:
        p.grad = p.grad.to(torch.float32)


@torch.no_grad()
def master_value(p: torch.Tensor, bottoms: Bottoms) -> torch.Tensor:
    """The float32 value of ``p`` as a new tensor: the exact join of a split parameter's halves, or the parameter's
    value widened to (or copied as) float32."""
    bottom = bottoms.get(p)
    if bottom is not None:
        return join(p.detach(), bottom)
    return p.detach().to(dtype=torch.float32, copy=True)


@torch.no_grad()
def set_master_value(p: torch.Tensor, value: torch.Tensor, bottoms: Bottoms) -> None:
    """Sets ``p`` to the float32 ``value`` (of p's shape, checked by the caller): both halves of a split parameter,
    so a plain fp32 checkpoint is re-split exactly, or ``p`` itself, rounded to its dtype."""
    bottom = bottoms.get(p)
    if bottom is None:
        p.copy_(value)
        return
    top, low = split(value.detach().to(torch.float32))
    p.copy_(top)
    bottom.copy_(low)
