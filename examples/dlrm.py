"""A DLRM-style recommendation model trained with ember beside stock PyTorch, on synthetic Criteo-shaped data.

The model: a bottom MLP over 13 dense features, 26 embedding tables (one per categorical feature, pooled as bags),
DLRM's dot interaction, and a top MLP to a click probability. Stock PyTorch runs it as a loop of
``nn.EmbeddingBag(sparse=True)`` with torch.optim.SGD (which takes their sparse gradients); ember runs the same
model with ``ember.nn.MergedEmbeddingBagWithSGD`` (every table in one operator, the SGD step inside its backward),
``ember.nn.functional.interaction``, and ``ember.optimize(..., dtype=torch.bfloat16)`` for the MLPs. Both start from
the same weights and see the same batches; the script prints each one's training throughput and loss.

    python examples/dlrm.py [--steps 60] [--batch 2048] [--max-rows 200000] [--pooling 4]
    ember-run examples/dlrm.py
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

import ember
from ember.nn import MergedEmbeddingBagWithSGD, dense_parameters
from ember.nn.functional import interaction

DENSE, TABLES, DIM = 13, 26, 64
# Criteo Kaggle's categorical cardinalities, capped by --max-rows.
CRITEO_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
               10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]  # fmt: skip


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def torch_interaction(dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
    """DLRM's interact_features (dot, no self-interaction)."""
    x = torch.stack([dense, *sparse], dim=1)
    z = torch.bmm(x, x.transpose(1, 2))
    li, lj = torch.tril_indices(x.shape[1], x.shape[1], offset=-1)
    return torch.cat([dense, z[:, li, lj]], dim=1)


class DLRM(nn.Module):
    def __init__(self, rows: list[int]) -> None:
        super().__init__()
        self.bottom = mlp([DENSE, 256, 128, DIM])
        self.emb_l = nn.ModuleList([nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in rows])
        width = DIM + (TABLES + 1) * TABLES // 2
        self.top = mlp([width, 512, 256, 1])
        self.interact = torch_interaction

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        if isinstance(self.emb_l, MergedEmbeddingBagWithSGD):
            pooled = self.emb_l(indices, offsets)
        else:
            pooled = [table(i, o) for table, i, o in zip(self.emb_l, indices, offsets)]
        return self.top(self.interact(x, *pooled)).squeeze(1)


def synthetic_batches(rows: list[int], count: int, batch: int, pooling: int, seed: int = 0) -> list[tuple]:
    """Criteo-shaped batches: log-normal dense features, power-law categorical ids, clicks from a hidden rule."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(DENSE, generator=gen)
    out = []
    for _ in range(count):
        dense = torch.log1p(torch.exp(torch.randn(batch, DENSE, generator=gen)))
        indices, offsets = [], []
        for n in rows:
            u = torch.rand(batch * pooling, generator=gen)
            indices.append((n * u.pow(3)).long().clamp_(max=n - 1))  # a few hot rows, a long tail
            offsets.append(torch.arange(0, batch * pooling, pooling))
        label = (torch.sigmoid(dense @ hidden - 1.0) > torch.rand(batch, generator=gen)).float()
        out.append((dense, indices, offsets, label))
    return out


def train(model: nn.Module, step, batches: list[tuple], warmup: int) -> tuple[float, float]:
    """Runs every batch through `step`; returns samples/s after the warm-up steps and the mean loss of the last ten."""
    losses = []
    start = 0.0
    for k, (dense, indices, offsets, label) in enumerate(batches):
        if k == warmup:
            start = time.perf_counter()
        losses.append(step(dense, indices, offsets, label))
    elapsed = time.perf_counter() - start
    samples = (len(batches) - warmup) * batches[0][0].shape[0]
    return samples / elapsed, sum(losses[-10:]) / len(losses[-10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--pooling", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    rows = [min(n, args.max_rows) for n in CRITEO_ROWS]
    stock = DLRM(rows)
    fused = copy.deepcopy(stock)
    batches = synthetic_batches(rows, args.steps, args.batch, args.pooling)
    loss_fn = nn.BCEWithLogitsLoss()
    warmup = min(5, args.steps // 4)

    optimizer = torch.optim.SGD(stock.parameters(), lr=args.lr)

    def stock_step(dense, indices, offsets, label) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(stock(dense, indices, offsets), label)
        loss.backward()
        optimizer.step()
        return loss.item()

    # ember: the tables step themselves; the MLPs train in bf16 through ember.optimize and its fused SGD.
    fused.emb_l = MergedEmbeddingBagWithSGD.from_embeddingbag_list(
        [nn.EmbeddingBag(n, DIM, mode="sum") for n in rows], lr=args.lr
    )
    fused.emb_l.load_state_dict(stock.emb_l.state_dict())
    fused.interact = interaction
    fused_optimizer = torch.optim.SGD(dense_parameters(fused), lr=args.lr)
    fused, fused_optimizer = ember.optimize(fused, optimizer=fused_optimizer, dtype=torch.bfloat16)

    def ember_step(dense, indices, offsets, label) -> float:
        fused_optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(fused(dense, indices, offsets).float(), label)
        loss.backward()
        fused_optimizer.step()
        return loss.item()

    print(f"DLRM: {TABLES} tables x {DIM} ({sum(rows) * DIM * 4 / 2**20:.0f} MiB), batch {args.batch}, "
          f"{args.pooling} ids a bag, {args.steps} steps, {torch.get_num_threads()} threads")  # fmt: skip
    stock_rate, stock_loss = train(stock, stock_step, batches, warmup)
    ember_rate, ember_loss = train(fused, ember_step, batches, warmup)
    print(f"{'':28} {'samples/s':>10} {'loss':>8}")
    print(f"{'torch (fp32, sparse SGD)':28} {stock_rate:10.0f} {stock_loss:8.4f}")
    print(f"{'ember (bf16, fused tables)':28} {ember_rate:10.0f} {ember_loss:8.4f}")
    print(f"ember / torch: {ember_rate / stock_rate:.2f}x")


if __name__ == "__main__":
    main()
