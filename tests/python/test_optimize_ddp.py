"""ember.optimize under DistributedDataParallel over gloo: two processes on loopback train like one process that
sees both halves of every batch, with torch's bf16 all-reduce (torch >= 2.0) and with ember's fp32 hook (every
torch); ember.distributed.broadcast_master_weights makes ranks that started apart agree bit for bit."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ember

STEPS = 4
WORLD = 2

TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
# DDP's constructor broadcasts the parameters, bf16 ones here, and gloo before torch 2.0 has no bf16 collectives.
needs_gloo_bf16 = pytest.mark.skipif(not TORCH_2, reason="gloo has no bf16 broadcast or all_reduce before torch 2.0")


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


def ddp_worker(rank: int, port: int, out_path: str, hook: bool) -> None:
    with process_group(rank, port):
        state = train_under_ddp(rank, hook)
        if rank == 0:
            torch.save(state, out_path)


def train_under_ddp(rank: int, hook: bool) -> dict[str, torch.Tensor]:
    """Trains this rank's halves of the batches; returns the state dict. The DDP wrapper ends with the call."""
    model = make_model()
    model, optimizer = ember.optimize(
        model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=torch.bfloat16
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    if hook:
        ddp.register_comm_hook(None, ember.distributed.fp32_allreduce_hook)
    for step in range(STEPS):
        x, y = full_batch(step)
        half = slice(rank * 8, rank * 8 + 8)
        train_step(ddp, optimizer, x[half], y[half])
    return model.state_dict()


@contextlib.contextmanager
def process_group(rank: int, port: int) -> Iterator[None]:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        yield
        dist.barrier()  # every rank done with gloo before any tears its connections down
    finally:
        # DDP keeps the process group alive, in reference cycles: collected here, the group is destroyed (its gloo
        # threads joined) now rather than while the interpreter shuts down, when a gloo thread that drops its last
        # work's Python state aborted the process ("terminate called without an active exception", torch 2.13).
        gc.collect()
        dist.destroy_process_group()
    # Reached only when the body succeeded, its results already on disk: leave without interpreter finalization,
    # where gloo objects still referenced can destroy a joinable std::thread (the abort recurred once in CI after
    # the collection above; tests/python/launch_programs/ddp_train.py leaves the same way).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_gloo_bf16
@pytest.mark.parametrize("hook", [False, True], ids=["bf16 all_reduce", "fp32 hook"])
def test_ddp_over_gloo_matches_one_process_with_the_combined_batch(tmp_path, hook: bool) -> None:
    out_path = str(tmp_path / "rank0.pt")
    mp.spawn(ddp_worker, args=(free_port(), out_path, hook), nprocs=WORLD, join=True)
    distributed = torch.load(out_path)

    single = trained(batches=lambda step: full_batch(step))
    first_half_only = trained(batches=lambda step: tuple(t[:8] for t in full_batch(step)))
    initial = make_model().state_dict()

    def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return sum(((a[k] - b[k]) ** 2).sum().item() for k in a) ** 0.5

    # Not bit for bit: DDP averages two bf16 gradients (each rounded to 8 bits of mantissa, and without the hook
    # summed in bf16 by gloo) where one process rounds the gradient of the whole batch once, and Adam's first steps
    # amplify the difference of tiny gradients (m / sqrt(v) is their sign). So the runs are compared by how far
    # apart they end relative to how far training moved the weights: a fraction of a percent for rounding, while
    # training on half the data (what a broken all-reduce amounts to) lands tens of percent away.
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


def broadcast_worker(rank: int, port: int, out_path: str) -> None:
    with process_group(rank, port):
        torch.manual_seed(rank)  # the ranks start apart
        model = nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5))
        model, optimizer = ember.optimize(
            model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=torch.bfloat16
        )
        if TORCH_2:
            nn.parallel.DistributedDataParallel(model)  # syncs the bf16 tops (and fp32 norms) only
        sent = ember.distributed.broadcast_master_weights(optimizer)
        torch.save((sent, model.state_dict()), f"{out_path}.{rank}")


def test_broadcast_master_weights_makes_ranks_agree_bit_for_bit(tmp_path) -> None:
    out_path = str(tmp_path / "state")
    mp.spawn(broadcast_worker, args=(free_port(), out_path), nprocs=WORLD, join=True)
    (sent, rank0), (_, rank1) = (torch.load(f"{out_path}.{rank}") for rank in range(WORLD))
    assert sent == 4  # the two Linear layers' weights and biases
    for key in rank0:
        assert torch.equal(rank0[key].view(torch.int32), rank1[key].view(torch.int32)), key


def test_broadcast_master_weights_refuses_a_torch_optimizer() -> None:
    with pytest.raises(TypeError, match=r"ember\.optim optimizer"):
        ember.distributed.broadcast_master_weights(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
