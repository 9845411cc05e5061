"""ember.optimize under DistributedDataParallel over gloo: two processes on loopback train like one process that
sees both halves of every batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ember

STEPS = 4
WORLD = 2

pytestmark = pytest.mark.skipif(
    not dist.is_available() or int(torch.__version__.split(".")[0]) < 2,
    reason="gloo has no bf16 all_reduce before torch 2.0 (ember's bf16 gradients need it)",
)


def make_model() -> nn.Module:
    # No BatchNorm: under DDP each rank normalises its own half of the batch, which is not the combined batch's
    # statistics, so the comparison would measure that instead of ember.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5))


def full_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def ddp_worker(rank: int, port: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = make_model()
        model, optimizer = ember.optimize(
            model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=torch.bfloat16
        )
        ddp = nn.parallel.DistributedDataParallel(model)
        for step in range(STEPS):
            x, y = full_batch(step)
            half = slice(rank * 8, rank * 8 + 8)
            train_step(ddp, optimizer, x[half], y[half])
        if rank == 0:
            torch.save(model.state_dict(), out_path)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_over_gloo_matches_one_process_with_the_combined_batch(tmp_path) -> None:
    out_path = str(tmp_path / "rank0.pt")
    mp.spawn(ddp_worker, args=(free_port(), out_path), nprocs=WORLD, join=True)
    distributed = torch.load(out_path)

    single = trained(batches=lambda step: full_batch(step))
    first_half_only = trained(batches=lambda step: tuple(t[:8] for t in full_batch(step)))
    initial = make_model().state_dict()

    def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return sum(((a[k] - b[k]) ** 2).sum().item() for k in a) ** 0.5

    # Not bit for bit: DDP averages two bf16 gradients (each rounded to 8 bits of mantissa, and summed in bf16 by
    # gloo) where one process rounds the gradient of the whole batch once, and Adam's first steps amplify the
    # difference of tiny gradients (m / sqrt(v) is their sign). So the runs are compared by how far apart they end
    # relative to how far training moved the weights: a fraction of a percent for rounding, while training on half
    # the data (what a broken all-reduce amounts to) lands tens of percent away.
    moved = distance(single, initial)
    assert all(distributed[k].dtype == torch.float32 for k in single)
    assert distance(distributed, single) < 0.01 * moved
    assert distance(first_half_only, single) > 0.1 * moved


def trained(batches) -> dict[str, torch.Tensor]:
    """One process's run (one thread, as each DDP rank has)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_model()
        model, optimizer = ember.optimize(
            model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=torch.bfloat16
        )
        for step in range(STEPS):
            train_step(model, optimizer, *batches(step))
        return model.state_dict()
    finally:
        torch.set_num_threads(threads)
