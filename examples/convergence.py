"""Does bf16 training with ember converge like fp32 training with stock PyTorch?

Two real small models, each trained twice from the same initial weights on the same batches: once in fp32 with
torch.optim.AdamW, once with ``ember.optimize(model, optimizer=AdamW(...), dtype=torch.bfloat16)`` (bf16 compute,
split-BF16 master weights, ember's fused AdamW). Three more runs, fp32 again but each with another data order,
measure how far equally good fp32 runs drift apart: their mean drift is the yardstick for the bf16 run (one
reshuffle alone is a poor one: on the quick tasks of the test, single reshuffles drift 1.5-6x apart).

- ``digits``: a small CNN on the 8x8 handwritten digits that scikit-learn ships (1797 images, 10 classes).
- ``reverse``: a 2-layer torch.nn.TransformerEncoder that outputs its input sequence reversed (tokens 0-15,
  length 12); every output position has to attend to another one.

    python examples/convergence.py [--task digits reverse] [--epochs N]

tests/python/test_optimize_convergence.py runs the same functions for fewer epochs.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

import ember


@dataclass
class Dataset:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


@dataclass
class Run:
    """One training run: mean training loss per epoch and the final accuracy on the held-out set (in %)."""

    label: str
    epoch_losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0
    seconds: float = 0.0


def digits_data(seed: int = 0) -> Dataset:
    """scikit-learn's digits, pixels scaled to [0, 1], a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = len(y) * 4 // 5
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


VOCAB, LENGTH = 16, 12


def reverse_data(seed: int = 0, train_size: int = 4096, test_size: int = 512) -> Dataset:
    """Random token sequences; the target is the same sequence reversed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (train_size + test_size, LENGTH), generator=gen)
    y = x.flip(1)
    return Dataset(x[:train_size], y[:train_size], x[train_size:], y[train_size:])


class ReverseTransformer(nn.Module):
    def __init__(self, d_model: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.position = nn.Parameter(torch.randn(LENGTH, d_model) * 0.1)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.out = nn.Linear(d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(self.embed(tokens) + self.position))


@dataclass
class Task:
    data: Callable[[], Dataset]
    model: Callable[[], nn.Module]
    lr: float
    batch: int
    epochs: int  # of the full run (the example); the test runs fewer


TASKS = {
    "digits": Task(digits_data, DigitsCNN, lr=2e-3, batch=64, epochs=20),
    "reverse": Task(reverse_data, ReverseTransformer, lr=1e-3, batch=64, epochs=15),
}


def classification_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # Token-level tasks flatten to (tokens, classes); the loss is computed in fp32 whatever the logits' dtype.
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def train(task: Task, data: Dataset, initial: nn.Module, *, ember_bf16: bool, order_seed: int, epochs: int) -> Run:
    """Trains a copy of ``initial``; the batches follow ``order_seed``, dropout follows a fixed seed."""
    model = copy.deepcopy(initial).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=0.01)
    if ember_bf16:
        model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, inplace=True)
    run = Run(("ember bf16" if ember_bf16 else "torch fp32") + f", data order {order_seed}")
    order_gen = torch.Generator().manual_seed(order_seed)
    torch.manual_seed(1)
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(data.train_y), generator=order_gen)
        total, batches = 0.0, 0
        for first in range(0, len(order), task.batch):
            index = order[first : first + task.batch]
            optimizer.zero_grad()
            loss = classification_loss(model(data.train_x[index]), data.train_y[index])
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            batches += 1
        run.epoch_losses.append(total / batches)
    run.seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        predicted = model(data.test_x).argmax(-1)
    run.accuracy = 100.0 * float((predicted == data.test_y).float().mean())
    return run


def curve_distance(a: Run, b: Run) -> float:
    """Summed per-epoch difference of two runs' mean training losses."""
    assert len(a.epoch_losses) == len(b.epoch_losses)
    return sum(abs(x - y) for x, y in zip(a.epoch_losses, b.epoch_losses))


def compare(task: Task, epochs: int | None = None, reshuffles: int = 3) -> tuple[Run, Run, list[Run]]:
    """(fp32 reference, ember bf16 with the same batches, fp32 runs on ``reshuffles`` other data orders)."""
    data = task.data()
    torch.manual_seed(0)
    initial = task.model()
    epochs = epochs or task.epochs
    reference = train(task, data, initial, ember_bf16=False, order_seed=0, epochs=epochs)
    bf16 = train(task, data, initial, ember_bf16=True, order_seed=0, epochs=epochs)
    reordered = [
        train(task, data, initial, ember_bf16=False, order_seed=seed, epochs=epochs)
        for seed in range(1, reshuffles + 1)
    ]
    return reference, bf16, reordered


def reshuffle_noise(reference: Run, reshuffled: list[Run]) -> float:
    """The mean loss-curve distance of the reshuffled fp32 runs to the reference: the task's own noise."""
    return sum(curve_distance(reference, run) for run in reshuffled) / len(reshuffled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--epochs", type=int, help="epochs per run (default: each task's full run)")
    args = parser.parse_args()
    for name in args.task:
        reference, bf16, reshuffled = compare(TASKS[name], args.epochs)
        runs = [reference, bf16, *reshuffled]
        print(f"\n== {name}: mean training loss per epoch ==")
        print("epoch  " + "  ".join(f"{run.label:>26}" for run in runs))
        for epoch, losses in enumerate(zip(*(run.epoch_losses for run in runs)), 1):
            print(f"{epoch:5d}  " + "  ".join(f"{loss:26.4f}" for loss in losses))
        for run in runs:
            print(f"{run.label:>26}: test accuracy {run.accuracy:6.2f}%, {run.seconds:6.1f} s")
        print(
            f"loss-curve distance to the fp32 run: ember bf16 {curve_distance(reference, bf16):.4f}, "
            f"fp32 on other data orders {reshuffle_noise(reference, reshuffled):.4f} on average"
        )


if __name__ == "__main__":
    main()
