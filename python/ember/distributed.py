"""torch.distributed helpers for models that ``ember.optimize`` prepared for bf16 training.

DistributedDataParallel all-reduces each bucket of gradients in the gradients' dtype, bf16 here, and gloo sums
bf16 in bf16, rounding after every addition. :func:`fp32_allreduce_hook` sums in fp32 and rounds the average to
bf16 once:

    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, ember.distributed.fp32_allreduce_hook)

DDP also makes every rank start from rank 0's parameters, but ember's master weights keep their bottom halves in
the optimizer, which DDP does not see. Ranks that build the model from the same seed agree anyway; otherwise
call :func:`broadcast_master_weights` after creating DDP.

torch 1.13's gloo has no bf16 collectives at all, and DDP's constructor broadcasts the (bf16) parameters, so DDP
over gloo with bf16 weights needs torch >= 2.0. :func:`broadcast_master_weights` works on every torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ember.optim import FusedOptimizer

__all__ = ["broadcast_master_weights", "fp32_allreduce_hook"]


def fp32_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: averages a bucket of gradients over the ranks in float32, whatever their dtype,
    and writes the average back into the bucket in its own dtype (rounded once).

    Register it with ``ddp.register_comm_hook(None, fp32_allreduce_hook)`` (or a process group as the state).
    Takes ``(process group or None, torch.distributed.GradBucket)`` and returns a ``Future`` of the bucket's
    tensor. (Not annotated: DDP compares a hook's annotations with its own classes, and this module's are strings.)
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer: torch.Tensor = bucket.buffer()
    wide = buffer.to(torch.float32).div_(dist.get_world_size(group))
    future = dist.all_reduce(wide, group=group, async_op=True).get_future()

    def narrow(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(narrow)


@torch.no_grad()
def broadcast_master_weights(optimizer: FusedOptimizer, src: int = 0, group: Any = None) -> int:
    """Gives every rank rank ``src``'s exact fp32 master weights (both halves of each split parameter); returns how
    many parameters were sent. Call it on every rank of ``group``."""
    if not isinstance(optimizer, FusedOptimizer):
        raise TypeError(
            f"broadcast_master_weights: optimizer must be an ember.optim optimizer, got {type(optimizer).__name__}"
        )
    split = list(optimizer._bottoms())
    for p in split:
        # The joined fp32 value: every backend broadcasts float32, and it re-splits exactly.
        weight = optimizer.master_weight(p).contiguous()
        dist.broadcast(weight, src, group=group)
        optimizer.set_master_weight(p, weight)
    return len(split)
